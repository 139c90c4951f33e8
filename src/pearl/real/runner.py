"""The model runner: the only part of the real engine that touches tensors during a step.

Given the scheduler's batch — (request, n new tokens) pairs — it builds the ragged batch, runs the
decoder over it (writing each session's KV), and samples a token for every request whose KV now
covers its whole context. It does not decide what runs (the scheduler does), which KV exists (the
block table does; the KV cache follows it) nor when a request ends (the engine does). It checks that
each session's KV holds exactly the positions the scheduler counts as computed.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.engine.request import Request
from pearl.real.kvcache import KVCache
from pearl.real.modeling import Decoder, SeqChunk
from pearl.real.sampling import Sampler, SamplingParams


@dataclass
class StepResult:
    sampled: list[tuple[Request, int, float]]  # (request, token, log-prob), in batch order
    tokens_computed: int  # Σ n over the batch (prefill chunk tokens + decode tokens)


class ModelRunner:
    def __init__(self, decoder: Decoder, kv: KVCache, sampler: Sampler):
        self.decoder, self.kv, self.sampler = decoder, kv, sampler

    def run(self, items: list[tuple[Request, int]], params: dict[int, SamplingParams]) -> StepResult:
        chunks, wants = [], []
        for req, n in items:
            ids = req.token_ids
            if ids is None:
                raise ValueError(f"request {req.rid} has no token_ids: the real engine needs tokens")
            if self.kv.length(req.session) != req.num_computed:
                raise RuntimeError(f"session {req.session!r}: the scheduler counts {req.num_computed} computed "
                                   f"tokens but the KV cache holds {self.kv.length(req.session)}")
            want = req.num_computed + n == req.num_tokens
            chunks.append(SeqChunk(req.session, req.num_computed, ids[req.num_computed: req.num_computed + n], want))
            if want:
                wants.append(req)
        logits = self.decoder.forward(chunks, self.kv)
        if not wants:
            return StepResult([], sum(n for _, n in items))
        tokens, lps = self.sampler.sample(logits, [params[r.rid] for r in wants], [r.num_tokens for r in wants])
        return StepResult(list(zip(wants, tokens, lps)), sum(n for _, n in items))
