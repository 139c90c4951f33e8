"""`VLLMEngine`: vLLM as a PEARL rollout engine (`pearl.real.engine_api.RolloutEngine`).

vLLM is imported lazily (only when an engine is built), so the core never needs it; install it with
`make setup-vllm` (the `vllm` extra). What it does:

- token ids in and out: each turn is a `TokensPrompt`; vLLM's automatic prefix caching plays the part
  of our session KV reuse (a trajectory's next turn extends the cached tokens);
- per-token log-probs of the distribution sampled from (`logprobs_mode="processed_logprobs"`: after
  temperature, top-p and the allowed-token mask, as `TorchEngine` records them), and the weights'
  version stamped on every token when it comes out of a step;
- weights updated in place from the trainer's state dict (Hugging Face names) with
  `collective_rpc("reload_weights")`; the prefix cache is reset so later prefills use the new weights
  (requests in flight keep their KV, as in `TorchEngine`; vLLM refuses the reset while they hold
  blocks, and then cached prefixes outlive the update too, as a `TorchEngine` session's KV does);
- evictions counted as the simulator and `TorchEngine` count them (`EngineStats.evictions`, the
  signal of PEARL's in-flight cap): a session's next turn on this engine whose prefix-cache hit
  (`RequestOutput.num_cached_tokens`) falls short of the full blocks its last turn here left cached
  found them evicted (a weight update resets the cache on purpose: not an eviction);
- `abort` keeps the generated tokens; `migrate_out` hands the request over without KV (vLLM's KV
  connectors are not used here: see docs/engines.md), so the context is prefilled again elsewhere;
- the mixed role only: prefill/decode disaggregation needs a KV connector (none is wired on CPU).

The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the "uni" executor): the
model lives here, a weight update is a copy in memory, tokens are stamped exactly with the version
they were sampled under, and no `__main__` guard is needed. The KV cache is sized from
`kv_capacity_tokens` (`kv_cache_memory_bytes`), never as a fraction of host memory.
"""
from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from pearl.engine.request import Request
from pearl.errors import ConfigError, ResourceError
from pearl.real.engine_api import EngineStats, Migration, Output
from pearl.real.sampling import SamplingParams
from pearl.types import Role

VLLM_MISSING = "engine.kind: vllm needs the vllm extra: make setup-vllm"
_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a broken install (say, torchvision next to the CPU torch)
        return False
    return True


def _import_vllm() -> Any:
    try:
        import vllm
    except Exception as err:
        raise ResourceError(f"{VLLM_MISSING} ({type(err).__name__}: {str(err).splitlines()[0][:120]})") from None
    return vllm


def model_folder(name: str) -> Path:
    """A Hugging Face folder (config, safetensors, tokenizer) vLLM can load for the model `name`: a
    user's model folder as given, or for smollm2-135m the cached conversion of the embedded GGUF."""
    from pearl.real import models

    if models.is_model_path(name):
        return Path(name).expanduser()
    if name != "smollm2-135m":
        raise ConfigError(f"engine.kind vllm: model {name!r} has no Hugging Face folder for vLLM "
                          "(use model: smollm2-135m or a model folder)")
    folder = models.smollm2_folder()
    if folder is None:
        raise ResourceError(f"model {name!r}: the converted folder cannot be written (is the cache writable?)")
    return folder


def kv_bytes_per_token(hf_config: Any, dtype: str) -> int:
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * heads * head_dim * _DTYPES[dtype]


class VLLMEngine:
    """A vLLM `LLMEngine` behind the `RolloutEngine` protocol (see the module docstring)."""

    roles = (Role.MIXED,)
    supports_kv_transfer = False

    # long: every vLLM setting is chosen here, with its reason
    def __init__(self, folder: str | Path, tokenizer: Any, role: Role | str = Role.MIXED, *, max_num_seqs: int = 32,
                 max_batched_tokens: int = 1024, kv_capacity_tokens: int = 16384, dtype: str = "float32",
                 seed: int = 0, version: int = 0, wid: int = 0, max_model_len: int | None = None):
        self.role = self._check_role(role)
        if dtype not in _DTYPES:
            raise ConfigError(f"vLLM engine dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (see docstring)
        vllm = _import_vllm()
        import torch
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(str(folder))
        ctx = min(max_model_len or hf.max_position_embeddings, hf.max_position_embeddings, kv_capacity_tokens)
        args = vllm.EngineArgs(
            model=str(folder), dtype=dtype, seed=seed, enforce_eager=True,  # eager: no compile at load
            kv_cache_memory_bytes=(kv_capacity_tokens + 1024) * kv_bytes_per_token(hf, dtype),  # + vLLM's reserve
            max_model_len=ctx, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max(max_batched_tokens, ctx), enable_prefix_caching=True,
            logprobs_mode="processed_logprobs", disable_log_stats=True)
        set_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op (it binds threads
        try:  # only with its multiprocess executor, not used here): keep ours working for the trainer
            self.llm = vllm.LLMEngine.from_engine_args(args)
        finally:
            torch.set_num_threads = set_threads
        self._vllm = vllm
        self.wid, self.tokenizer, self.folder = wid, tokenizer, Path(folder)
        self._version = version
        self.stats = EngineStats()
        self._live: dict[str, tuple[Request, SamplingParams]] = {}  # vLLM request id -> (request, params)
        self._vid: dict[Any, str] = {}  # our rid -> vLLM request id
        self._sessions: dict[str, Any] = {}
        self._held: dict[str, int] = {}  # session -> its context when its last turn here finished
        self._expect: dict[str, int] = {}  # vLLM request id, till its first output -> the prefix-cache
        #                                   hit it should get (tokens; 0: nothing expected)
        self._rids, self._seq = itertools.count(), itertools.count()
        self._blocks = self.llm.vllm_config.cache_config.num_gpu_blocks or 0
        self._block_size = self.llm.vllm_config.cache_config.block_size

    @staticmethod
    def _check_role(role: Role | str) -> Role:
        try:
            r = Role(role)
        except ValueError:
            raise ConfigError(f"engine role {role!r} is not one of mixed, prefill, decode") from None
        if r is not Role.MIXED:
            raise ConfigError(f"the vLLM engine serves the mixed role only (asked for {r.value}): prefill/decode "
                              "disaggregation needs a KV connector, none works on CPU (docs/engines.md)")
        return r

    @classmethod
    def from_loaded(cls, loaded: Any, role: Role | str = Role.MIXED, **kw: Any) -> "VLLMEngine":
        """An engine for a model loaded by `pearl.real.models.load_model` (its tokenizer, its folder)."""
        return cls(model_folder(loaded.spec.name), loaded.tokenizer, role, **kw)

    # ------------------------------------------------------------ views
    @property
    def version(self) -> int:
        return self._version

    @property
    def kv_capacity(self) -> int:
        return self._blocks * self._block_size

    def kv_used(self) -> int:
        try:
            usage = self.llm.engine_core.engine_core.scheduler.get_kv_cache_usage()
            return int(round(usage * self.kv_capacity))
        except AttributeError:  # another vLLM layout: estimate from the live contexts
            return min(self.kv_capacity, sum(r.num_tokens for r, _ in self._live.values()))

    def load(self) -> int:
        return len(self._live)

    def holds(self, session: str) -> int:
        """vLLM's prefix cache is by content, not by session: nothing is held for a session as such."""
        return 0

    def requests(self) -> list[Request]:
        return [r for r, _ in self._live.values()]

    def has_work(self) -> bool:
        return bool(self._live)

    # ------------------------------------------------------------ submission
    def add_request(self, token_ids: Iterable[int], params: SamplingParams | None = None, *,
                    session: str | None = None, rid: Any = None, kv: Any = None) -> Request:
        params = params or SamplingParams()
        rid = next(self._rids) if rid is None else rid
        ids = list(token_ids)
        req = Request(rid=rid, session=session if session is not None else f"r{rid}", num_tokens=len(ids),
                      max_new_tokens=params.max_new_tokens, token_ids=ids)
        self.submit(req, params, kv=kv)
        return req

    def submit(self, req: Request, params: SamplingParams, kv: Any = None) -> None:
        """Queue a request (it may carry tokens generated elsewhere: they count towards max_new_tokens).
        `kv` from another engine cannot be imported: the context is prefilled here (prefix cache first)."""
        ids = req.token_ids
        if ids is None or len(ids) != req.num_tokens or req.num_tokens < 1:
            raise ConfigError(f"request {req.rid}: token_ids must be a non-empty list of num_tokens ids")
        if req.rid in self._vid:
            raise ConfigError(f"request id {req.rid!r} is already running on engine {self.wid}")
        if req.session in self._sessions:
            raise ConfigError(f"session {req.session!r} already has a request running on engine {self.wid}")
        left = params.max_new_tokens - req.num_generated
        if req.num_tokens + max(left, 1) > self.llm.model_config.max_model_len:
            raise ResourceError(f"request {req.rid}: {req.num_tokens} context tokens do not fit the engine's "
                                f"context of {self.llm.model_config.max_model_len} tokens")
        req.max_new_tokens, req.prefill_only = params.max_new_tokens, False
        vid = f"{self.wid}-{next(self._seq)}"
        held = min(self._held.pop(req.session, 0), req.num_tokens) - 1  # (the last token is recomputed)
        self._expect[vid] = max(held, 0) // self._block_size * self._block_size  # whole blocks only
        self.llm.add_request(vid, self._vllm.inputs.TokensPrompt(prompt_token_ids=list(ids)),
                             self._params(params, max(left, 1)))
        self._live[vid], self._vid[req.rid], self._sessions[req.session] = (req, params), vid, req.rid

    def _params(self, p: SamplingParams, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        stop_ids = self.tokenizer.stop_token_ids if p.stop_token_ids is None else p.stop_token_ids
        return self._vllm.SamplingParams(
            temperature=p.temperature, top_p=p.top_p, max_tokens=max_tokens, seed=p.seed, stop=list(p.stop) or None,
            stop_token_ids=None if p.ignore_eos else list(stop_ids), ignore_eos=p.ignore_eos,
            allowed_token_ids=list(p.allowed_token_ids) if p.allowed_token_ids is not None else None,
            logprobs=0, detokenize=bool(p.stop), output_kind=RequestOutputKind.DELTA)

    # ------------------------------------------------------------ the step
    def step(self) -> list[Output]:
        """Run one vLLM step; return the requests that finished in it."""
        if not self._live:
            return []
        t0 = time.perf_counter()
        results = self.llm.step()
        version, outs = self._version, []
        for ro in results:
            entry = self._live.get(ro.request_id)
            if entry is None:
                continue
            req, _ = entry
            self._check_cached(ro)
            c = ro.outputs[0]
            lps = c.logprobs or [None] * len(c.token_ids)
            for tok, lp in zip(c.token_ids, lps):
                req.append_token(tok, float(lp[tok].logprob) if lp else 0.0, version)
            self.stats.tokens_decoded += len(c.token_ids)
            if ro.finished:
                outs.append(self._finish(ro.request_id, req, c))
        self.stats.steps += 1
        self.stats.busy_s += time.perf_counter() - t0
        return outs

    def _check_cached(self, ro: Any) -> None:
        """A request's first output: its prefix-cache hit, against what its session left here."""
        if ro.request_id not in self._expect:
            return  # (a later output of the same request)
        want, got = self._expect.pop(ro.request_id), getattr(ro, "num_cached_tokens", None)
        if got is None:
            return
        self.stats.tokens_reused += got
        if got < want:
            self.stats.evictions += 1

    def _finish(self, vid: str, req: Request, c: Any) -> Output:
        reason, stop = c.finish_reason or "length", None
        if reason == "stop":
            if isinstance(c.stop_reason, str):
                reason, stop = "stop", c.stop_reason
            else:
                reason = "eos"
        self._forget(vid, req)
        self._held[req.session] = req.num_tokens
        self.stats.finished += 1
        return Output(req, reason, None, stop)

    def _forget(self, vid: str, req: Request) -> None:
        self._live.pop(vid, None)
        self._expect.pop(vid, None)
        self._vid.pop(req.rid, None)
        self._sessions.pop(req.session, None)

    # ------------------------------------------------------------ leaving early
    def abort(self, rid: Any, keep_kv: bool = False) -> Output:
        """Take a request out; its generated tokens (log-probs, versions) stay on `Output.req`."""
        vid = self._vid.get(rid)
        if vid is None:
            raise KeyError(f"no running request {rid!r} on engine {self.wid}")
        self.llm.abort_request([vid])
        req, _ = self._live[vid]
        self._forget(vid, req)
        self.stats.aborted += 1
        return Output(req, "abort")

    def migrate_out(self, rid: Any) -> Migration:
        """Abort a request and package it (without KV: see the module docstring) for another engine."""
        vid = self._vid.get(rid)
        if vid is None:
            raise KeyError(f"no running request {rid!r} on engine {self.wid}")
        params = self._live[vid][1]
        return Migration(self.abort(rid).req, params, None)

    def migrate_in(self, m: Migration) -> Request:
        self.submit(m.req, m.params)
        return m.req

    def export_kv(self, session: str) -> Any:
        raise ResourceError("the vLLM engine cannot export KV here (supports_kv_transfer is False)")

    def import_kv(self, session: str, blob: Any) -> None:
        raise ResourceError("the vLLM engine cannot import KV here (supports_kv_transfer is False)")

    def drop_session(self, session: str) -> None:
        """Nothing to free: cached prefixes are evicted by vLLM (LRU) when the space is needed; the
        session is no longer expected to find its prefix here."""
        self._held.pop(session, None)

    def set_role(self, role: Role | str) -> None:
        self.role = self._check_role(role)

    def abort_all(self) -> list[Output]:
        return [self.abort(rid) for rid in list(self._vid)]

    # ------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Load new weights in place (Hugging Face names; all or some); tokens sampled from now on carry
        `version`. A reset of the prefix cache is asked for, so that later prefills see the new weights;
        vLLM refuses it while requests in flight hold blocks (then cached prefixes stay)."""
        weights = [(k, v) for k, v in state_dict.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                          "is_checkpoint_format": True})
        if self.llm.reset_prefix_cache() is not False:  # nothing cached survives: later misses are not evictions
            self._held.clear()
            self._expect = dict.fromkeys(self._expect, 0)
        # else vLLM refused (requests in flight hold blocks): cached prefixes outlive this update, as a
        # `TorchEngine` session's retained KV does
        self._version = version

    def close(self) -> None:
        """Shut the engine core down (its memory is freed with the object)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        self._live.clear(), self._vid.clear(), self._sessions.clear()
        try:
            llm.engine_core.shutdown()
        except Exception:  # already down
            pass

    def score(self, token_ids: list[int]) -> list[float]:
        """Log-probs of tokens 1.. of `token_ids`, each given the tokens before it (vLLM's prompt
        log-probs: the raw distribution, temperature 1) under the current weights. Only while the
        engine is idle: it runs its own steps."""
        if self._live:
            raise ResourceError(f"engine {self.wid}: score() needs an idle engine ({len(self._live)} requests run)")
        vid = f"{self.wid}-score-{next(self._seq)}"
        sp = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        self.llm.add_request(vid, self._vllm.inputs.TokensPrompt(prompt_token_ids=list(token_ids)), sp)
        while True:
            for ro in self.llm.step():
                if ro.request_id == vid and ro.finished:
                    return [float(d[t].logprob) for d, t in zip(ro.prompt_logprobs[1:], token_ids[1:])]

    # ------------------------------------------------------------ convenience
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 max_steps: int = 1_000_000) -> list[Output]:
        """Submit the prompts, step until all are done, return their outputs in prompt order."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        done: dict[Any, Output] = {}
        for _ in range(max_steps):
            if len(done) == len(reqs):
                break
            for o in self.step():
                done[o.rid] = o
        return [done[r.rid] for r in reqs if r.rid in done]


__all__ = ["VLLMEngine", "VLLM_MISSING", "model_folder", "vllm_available"]
