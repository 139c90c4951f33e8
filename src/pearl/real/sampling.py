"""Token sampling for the real engine: temperature, top-p, allowed-token masks, seeded per request.

Which log-prob we report. Each sampled token carries log p(token) under **the distribution it was
actually drawn from**: logits masked to the allowed tokens, divided by the temperature, truncated to
the top-p nucleus and renormalised. That is the behaviour policy an off-policy correction needs. With
the RL defaults (temperature 1, top_p 1, no mask) it is exactly log_softmax(logits)[token], what the
trainer recomputes in one forward pass. Greedy decoding (temperature 0) draws from a point mass, whose
log-prob (0) says nothing; there we report log_softmax of the untempered logits (after the mask),
i.e. the model's own probability of the token it chose.

Seeding. A request with a seed draws token i with a generator seeded from (seed, i), where i is the
length of the context it is sampled after. Sampling is then a pure function of (weights, context,
seed), so a request that is aborted, migrated or handed off and resumed elsewhere draws the same
tokens as one that never moved; no generator state has to travel with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pearl.errors import ConfigError

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, position) over the seed space


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int | None = None  # None: drawn from the engine's own generator (not reproducible)
    stop: tuple[str, ...] = ()  # stop strings: generation ends once the decoded response contains one
    stop_token_ids: tuple[int, ...] | None = None  # None: the tokenizer's eos ids
    ignore_eos: bool = False
    allowed_token_ids: tuple[int, ...] | None = None  # fixed action set; None: the whole vocabulary

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"sampling max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:
            raise ConfigError("sampling allowed_token_ids is empty: no token could ever be sampled")
        if isinstance(self.stop, str):  # a lone string is a common slip; treat it as one stop string
            object.__setattr__(self, "stop", (self.stop,))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def position_seed(seed: int, position: int) -> int:
    return ((seed * _MIX) ^ (position * 0xBF58476D1CE4E5B9)) & 0x7FFF_FFFF_FFFF_FFFF


class Sampler:
    """Samples one token per row of a logits matrix, each row with its own SamplingParams."""

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size = vocab_size
        self._gen = torch.Generator().manual_seed(seed)  # for requests without a seed
        self._row_gen = torch.Generator()
        self._masks: dict[tuple[int, ...], torch.Tensor] = {}

    def _mask(self, allowed: tuple[int, ...], device: torch.device) -> torch.Tensor:
        m = self._masks.get(allowed)
        if m is None:
            bad = [t for t in allowed if not 0 <= t < self.vocab_size]
            if bad:
                raise ConfigError(f"sampling allowed_token_ids {bad[:5]} are outside the vocabulary "
                                  f"(size {self.vocab_size})")
            m = torch.full((self.vocab_size,), float("-inf"), device=device)
            m[list(allowed)] = 0.0
            if len(self._masks) > 256:  # environments reuse a handful of action sets; bound the memo
                self._masks.clear()
            self._masks[allowed] = m
        return m

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, params: list[SamplingParams],
               positions: list[int]) -> tuple[list[int], list[float]]:
        """logits [B, V]; `positions[b]` is the context length row b samples after (seeds the draw).
        Returns the sampled token ids and their log-probs (see the module docstring)."""
        logits = logits.float()[:, : self.vocab_size]
        if any(p.allowed_token_ids is not None for p in params):
            logits = logits.clone()
            for b, p in enumerate(params):
                if p.allowed_token_ids is not None:
                    logits[b] += self._mask(p.allowed_token_ids, logits.device)
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params],
                             device=logits.device)
        logp = torch.log_softmax(logits / temps[:, None], dim=-1)  # one batched op for every row
        best = logp.argmax(dim=-1, keepdim=True)
        tokens = best[:, 0].tolist()
        out_lp: list[float] = logp.gather(1, best)[:, 0].tolist()  # right for greedy rows
        for b, p in enumerate(params):
            if p.greedy:
                continue
            row = logp[b]
            if p.top_p < 1.0:
                row = _top_p(row, p.top_p)
            gen = self._gen
            if p.seed is not None:
                gen = self._row_gen
                gen.manual_seed(position_seed(p.seed, positions[b]))
            tok = int(torch.multinomial(row.exp(), 1, generator=gen))
            tokens[b], out_lp[b] = tok, float(row[tok])
        return tokens, out_lp


def _top_p(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise (log space)."""
    sorted_lp, idx = torch.sort(logp, descending=True)
    mass_before = torch.cumsum(sorted_lp.exp(), 0) - sorted_lp.exp()
    drop = mass_before >= top_p  # the first token is always kept (mass_before = 0)
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    kept = torch.full_like(logp, float("-inf")).scatter(0, idx, sorted_lp)
    return kept - torch.logsumexp(kept, 0)
