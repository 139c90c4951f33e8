"""The `elastic:` section of a `pearl train` config: where elastic devices come from.

- `trace`: an availability trace (`pearl.config.ElasticConfig`: `kind: csv` with rows
  `t_add,t_remove,count,notice_s`, or `kind: poisson`), in seconds from the start of the run; each
  device is one more rollout-worker slot (a CPU slot, or a Ray actor with `backend: ray`), added,
  noticed and revoked on schedule (`notice_s` empty: revoked without notice).
- `ray_nodes` (backend ray): Ray nodes started with `--resources '{"pearl_elastic": N}'` join as N
  devices while they are alive (polled every `poll_s`); a node that leaves is a revocation.

The controller uses them only with `policy.elastic: true`.
"""
from __future__ import annotations

from pydantic import Field

from pearl.config import ElasticConfig, Frozen

__all__ = ["TrainElastic"]


class TrainElastic(Frozen):
    trace: ElasticConfig = ElasticConfig()
    horizon_s: float = Field(default=3600.0, gt=0, le=864000)  # a poisson trace is drawn up to this time
    ray_nodes: bool = False
    poll_s: float = Field(default=1.0, gt=0, le=3600)

    @property
    def enabled(self) -> bool:
        return self.trace.kind != "none" or self.ray_nodes
