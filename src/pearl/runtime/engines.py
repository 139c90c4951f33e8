"""Build one rollout engine of `pearl train` from the train config's `engine:` section.

`engine.kind: torch` is our engine (`pearl.real.engine.TorchEngine`: every role, KV hand-off and
migration, `engine.dtype`, the thread plan's engine threads); `engine.kind: vllm` is
`pearl.real.vllm_engine.VLLMEngine` (mixed role only; vLLM is imported only when one is built).
Both satisfy `pearl.real.engine_api.RolloutEngine`.
"""
from __future__ import annotations

from typing import Any

__all__ = ["build_engine"]


def build_engine(loaded: Any, es: Any, role: Any, wid: int, seed: int, num_threads: int, share: Any = None) -> Any:
    """The engine for worker `wid` in `role`; `share` is a live torch engine whose weights it may share."""
    if es.kind == "vllm":
        from pearl.real.vllm_engine import VLLMEngine

        return VLLMEngine.from_loaded(loaded, role, max_num_seqs=es.max_num_seqs, wid=wid, seed=seed,
                                      max_batched_tokens=es.max_batched_tokens,
                                      kv_capacity_tokens=es.kv_capacity_tokens)
    from pearl.real.engine import TorchEngine

    return TorchEngine(loaded, role, max_num_seqs=es.max_num_seqs, max_batched_tokens=es.max_batched_tokens,
                       kv_capacity_tokens=es.kv_capacity_tokens, seed=seed, wid=wid, share_weights_with=share,
                       dtype=es.dtype, num_threads=num_threads)
