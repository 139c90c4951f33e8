"""`TrainConfig`: the frozen, validated configuration of a real training run (`pearl train`).

One YAML file (the embedded default is `pearl/data/train_default.yaml`) plus `--set a.b=v`
overrides. A bad field is a one-line `ConfigError` naming it (via `parse_config`); unknown model and
environment names are checked by `check_names` before anything heavy is loaded.
"""
from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

import importlib.resources
from pathlib import Path

from pearl.config import ControllerConfig
from pearl.config import (MAX_DURATION_S, MAX_GROUP, MAX_SEED, MAX_SEQS, MAX_STALENESS, MAX_STEPS, MAX_TOKENS,
                          Frozen, PolicyConfig, deep_merge, parse_config, read_yaml)
from pearl.rl.trainer import TrainerConfig
from pearl.runtime.train_elastic import TrainElastic

MAX_TRAIN_BATCH = 65536  # trajectories per trainer step (prompts_per_step x group_size)
MAX_WORKERS = 1024  # rollout workers

# The context (max_position_embeddings) of each runnable model, from the configs the loaders in
# `pearl.real.models` build or read: `tiny_config()` says 4096; SmolLM2-135M-Instruct's config.json
# says 8192. A test checks both against the loaded configs. Lengths are checked against these before
# anything is loaded.
MODEL_CONTEXT: dict[str, int] = {"tiny": 4096, "smollm2-135m": 8192}


class EnvSpec(Frozen):
    """A built-in environment name or 'package.module:Class', its constructor kwargs, a step timeout."""

    name: str = "gridworld"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    # Every reset and step is bounded (a hung environment fails its trajectory, never the run).
    timeout_s: float = Field(default=10.0, gt=0, le=MAX_DURATION_S)
    # Environment calls run on a pool of this many threads, off the rollout thread, so one slow or
    # hung environment delays only its own trajectory; 0 runs them inline in a fixed order (with
    # `staleness: 0`, runs are then reproducible step for step).
    workers: int = Field(default=8, ge=0, le=256)
    use_system_prompt: bool = True  # the env's system prompt heads every trajectory


class SamplingConfig(Frozen):
    temperature: float = Field(default=1.0, ge=0, le=100)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: int = Field(default=32, ge=1, le=MAX_TOKENS)  # per turn; 1 when sampling is action-restricted
    restrict_actions: bool = True  # sample only the env's allowed actions when each is one token


class EngineSettings(Frozen):
    # torch: our engine (every role, KV hand-off and migration); vllm: vLLM in this process (the `vllm`
    # extra, `make setup-vllm`; model smollm2-135m; mixed workers only: no PD layout, no KV migration).
    kind: Literal["torch", "vllm"] = "torch"
    max_num_seqs: int = Field(default=64, ge=1, le=MAX_SEQS)
    max_batched_tokens: int = Field(default=1024, ge=16, le=MAX_TOKENS)
    kv_capacity_tokens: int = Field(default=65536, ge=64, le=MAX_TOKENS)
    # Local rollout workers step at the same time, one thread each (torch kernels release the GIL):
    # with a model whose steps are mostly matrix work (SmolLM2) two workers roll out faster than one;
    # with the tiny model the Python around its kernels dominates and it hardly matters.
    parallel_steps: bool = True
    # The engines' weights, activations and KV cache (bfloat16 halves the memory traffic of a decode step).
    dtype: Literal["float32", "bfloat16"] = "float32"


class ThreadsConfig(Frozen):
    """torch intra-op threads per role (`pearl.runtime.threads`); unset: one per rollout worker, the
    trainer the rest of the cores."""

    trainer: int | None = Field(default=None, ge=1, le=1024)
    engine: int | None = Field(default=None, ge=1, le=1024)  # per rollout worker
    interop: int | None = Field(default=None, ge=1, le=1024)


class TrainControllerConfig(ControllerConfig):
    """`ControllerConfig` for CPU workers: one that shares the weights of a live one starts, stops and
    hands over its requests in milliseconds."""

    wake_s: float = Field(default=0.05, ge=0, le=MAX_DURATION_S)
    stop_s: float = Field(default=0.05, ge=0, le=MAX_DURATION_S)
    migrate_tokens: int = Field(default=1024, ge=1, le=MAX_TOKENS)


class TrainPolicy(PolicyConfig):
    """`PolicyConfig` with defaults for a real run on this machine's time scale (seconds, not hours)."""

    name: Literal["fixed", "pearl", "rlboost+", "static-pd", "roll-partial"] = "pearl"
    decision_interval_s: float = Field(default=2.0, gt=0, le=MAX_DURATION_S)
    min_dwell_s: float = Field(default=4.0, ge=0, le=MAX_DURATION_S)
    horizon_s: float = Field(default=60.0, gt=0, le=MAX_DURATION_S)
    # Lend the trainer's core to rollout while the trainer waits for its batch (`pearl.control.borrowing`):
    # as a second thread of the live worker or to an extra worker, whichever is predicted faster; it is
    # handed back (the worker shrinks, or stops with its requests migrated) before the next step. On
    # backend ray (its local instance only) a second thread of a live actor: an actor starts in seconds.
    borrow: bool = False
    elastic: bool = False
    # [1, 2] (or None) on local torch engines: two rollout workers may also run as one engine on both
    # cores (tp 2 = its intra-op threads). Opt-in: the calibrated 2-thread model mis-ranks the tiny model.
    tps: list[int] | None = [1]
    controller: TrainControllerConfig = TrainControllerConfig()


class TrainConfig(Frozen):
    name: str = Field(default="gridworld-tiny", min_length=1)
    # An embedded model's name (`pearl.real.models.SOURCES`) or the path of a Hugging Face model folder
    # (config.json, safetensors, tokenizer; Llama / Qwen2 / Qwen3); `{path: DIR}` is the same as `DIR`.
    model: str = Field(default="tiny", min_length=1)
    env: EnvSpec = EnvSpec()
    max_steps: int = Field(default=40, ge=1, le=MAX_STEPS)
    prompts_per_step: int = Field(default=2, ge=1, le=MAX_TRAIN_BATCH)  # groups per trainer batch
    group_size: int = Field(default=16, ge=1, le=MAX_GROUP)  # samples per prompt (GRPO group)
    # GRPO's advantage is a sample's reward minus its group's mean: with group_size 1 it is always 0
    # and nothing is learned, so group_size 1 is refused unless this is set (say, to time rollouts).
    allow_single_sample: bool = False
    staleness: int = Field(default=1, ge=0, le=MAX_STALENESS)  # η: the most versions a trained token may lag
    sampling: SamplingConfig = SamplingConfig()
    trainer: TrainerConfig = TrainerConfig(lr=5e-4, micro_batch_size=32)
    engine: EngineSettings = EngineSettings()
    threads: ThreadsConfig = ThreadsConfig()
    # Precision of the trainer and the engines at once; `trainer.dtype` / `engine.dtype` override it per role.
    dtype: Literal["float32", "bfloat16"] | None = None
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    rollout_workers: int = Field(default=1, ge=1, le=MAX_WORKERS)
    # auto: with >= 2 rollout workers, the controller's selector picks colocated or 1P:(N-1)D from a
    # PerfModel of this model on hardware "cpu" (see pearl.runtime.real.choose_layout); 1 worker: colocated
    layout: Literal["auto", "colocated", "1P:1D"] = "auto"
    profile: str | None = None  # a saved profile (`pearl profile`) for layout auto; else a quick calibration
    # The controller ticked on the wall clock during the run (`pearl.control`): `pearl` re-decides
    # the layout every `decision_interval_s` (decisions in summary.json); `fixed` keeps the first one.
    # `policy.borrow: true` lends the trainer's core to rollout (a second thread or an extra worker)
    # while it waits for its batch. `policy.elastic: true` starts workers on the elastic devices of `elastic:`.
    policy: TrainPolicy = TrainPolicy()
    elastic: TrainElastic = TrainElastic()  # elastic devices: a trace and/or Ray nodes (runtime/train_elastic.py)
    backend: Literal["local", "ray"] = "local"  # ray: each rollout worker is a Ray actor (may span machines)
    # backend ray: join this running Ray cluster ("auto": the one started on this machine with `ray start`,
    # or HOST:PORT, its head's GCS address; `pearl train --address` sets it), else start a local instance.
    ray_address: str | None = Field(default=None, min_length=1, max_length=262)
    out_dir: str | None = None  # default runs/train-<name>
    log_every: int = Field(default=1, ge=1, le=MAX_STEPS)
    # Checkpoints (`ckpt-<step>` in the run directory; `pearl train --resume RUN_DIR` continues from
    # the newest whole one) every this many steps and at the end; the newest `keep_checkpoints` stay.
    checkpoint_every: int = Field(default=10, ge=1, le=MAX_STEPS)
    keep_checkpoints: int = Field(default=2, ge=1, le=1000)
    # The policy in Hugging Face format (`policy-<step>`) every this many steps (0: only at the end,
    # as `policy`).
    save_policy_every: int = Field(default=0, ge=0, le=MAX_STEPS)
    # Divergence: this many updates in a row with a non-finite loss or gradient stop the run with an
    # error; this many with an all-zero gradient print a warning.
    max_nonfinite_steps: int = Field(default=3, ge=1, le=MAX_STEPS)
    zero_grad_warn_steps: int = Field(default=3, ge=1, le=MAX_STEPS)
    # The trainer gives up (one-line error) when no batch completes for this long: a hung rollout
    # never becomes a silent hang of the run.
    stall_timeout_s: float = Field(default=600.0, gt=0, le=86400)

    @model_validator(mode="before")
    @classmethod
    def _dtype_default(cls, data: Any) -> Any:
        """A top-level `dtype` fills `trainer.dtype` and `engine.dtype` where they are not given."""
        if isinstance(data, dict) and data.get("dtype") in ("float32", "bfloat16"):  # else: its own error
            data = dict(data)
            for role in ("trainer", "engine"):
                sub = data.get(role)
                if sub is None or isinstance(sub, dict):
                    data[role] = {"dtype": data["dtype"], **(sub or {})}
                    if role == "trainer" and sub is None:  # keep the class default's other fields
                        data[role] = {**TrainConfig.model_fields["trainer"].default.model_dump(), **data[role]}
        return data

    @field_validator("model", mode="before")
    @classmethod
    def _model_path(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if set(v) != {"path"} or not isinstance(v["path"], str):
                raise ValueError(f"expected a model name, a folder path, or {{path: DIR}}; got {v!r}")
            return v["path"]
        return v

    @property
    def ray_cluster(self) -> str | None:
        """The Ray cluster a `backend: ray` run joins (`ray_address`, else RAY_ADDRESS); None: it starts
        a local instance."""
        return self.ray_address or os.environ.get("RAY_ADDRESS") or None

    @property
    def host_workers(self) -> int:
        """Rollout workers computing on this host's cores (the thread plan leaves them theirs): all of
        them on the local backend or Ray's local instance; none as actors of a joined cluster."""
        return 0 if self.backend == "ray" and self.ray_cluster else self.rollout_workers

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.layout == "1P:1D" and self.rollout_workers < 2:
            raise ValueError(f"layout '1P:1D' needs rollout_workers >= 2 (got {self.rollout_workers})")
        p = self.policy
        if p.name not in ("pearl", "fixed"):
            raise ValueError(f"policy.name {p.name!r}: pearl train runs 'pearl' or 'fixed'")
        if p.elastic != self.elastic.enabled:
            raise ValueError("policy.elastic needs an elastic: source (elastic.trace or elastic.ray_nodes)"
                             if p.elastic else "elastic: devices are used only with policy.elastic: true")
        if self.elastic.ray_nodes and self.backend != "ray":
            raise ValueError("elastic.ray_nodes needs backend: ray")
        if p.borrow and self.backend == "ray" and self.ray_address is not None:
            raise ValueError(borrow_needs_local_ray(self.ray_address))
        threads_tp = self.backend == "local" and self.engine.kind == "torch"
        if p.tps not in (None, [1]) and not (threads_tp and set(p.tps) <= {1, 2}):
            raise ValueError(f"policy.tps {p.tps}: pearl train's CPU workers run at tensor-parallel size 1, "
                             "or 2 (a worker's intra-op threads on two cores) on local torch engines")
        if p.per_role_tp:
            raise ValueError("policy.per_role_tp: pearl train's CPU workers all run at tensor-parallel size 1 "
                             "(no prefill tp of their own)")
        if p.side_tp is not None:
            raise ValueError("policy.side_tp: a knob of the simulated rlboost+ baseline (pearl train runs 'pearl', "
                             "which places side workers itself, or 'fixed')")
        if self.engine.kind == "vllm":
            _check_vllm(self)
        if self.ray_address is not None:
            _check_ray_address(self.ray_address, self.backend)
        if self.group_size == 1 and not self.allow_single_sample:
            raise ValueError("group_size 1: GRPO's advantage (reward minus the group's mean) is then always 0 "
                             "and nothing is learned; use group_size >= 2 (or set allow_single_sample: true)")
        if self.batch_size > MAX_TRAIN_BATCH:
            raise ValueError(f"prompts_per_step x group_size = {self.batch_size} trajectories per step; "
                             f"the most is {MAX_TRAIN_BATCH}")
        if self.trainer.micro_batch_size > MAX_TRAIN_BATCH:
            raise ValueError(f"trainer.micro_batch_size {self.trainer.micro_batch_size}: the most is "
                             f"{MAX_TRAIN_BATCH}")
        mnt, kv, ctx = self.sampling.max_new_tokens, self.engine.kv_capacity_tokens, model_context(self.model)
        if ctx is not None and mnt >= ctx:  # it would train on positions the model never saw
            raise ValueError(f"sampling.max_new_tokens ({mnt}) does not fit the context of model {self.model!r} "
                             f"({ctx} positions) with a prompt; use less than {ctx} (less the prompt)")
        if mnt >= kv:
            raise ValueError(f"sampling.max_new_tokens ({mnt}) leaves no room for a prompt in "
                             f"engine.kv_capacity_tokens ({kv}); raise kv_capacity_tokens or lower max_new_tokens")
        return self

    @property
    def batch_size(self) -> int:
        """Trajectories per trainer step (the staleness gate's B)."""
        return self.prompts_per_step * self.group_size


def _check_vllm(cfg: "TrainConfig") -> None:
    """What the vLLM engine cannot do (docs/engines.md), refused before anything loads."""
    if cfg.layout == "1P:1D":
        raise ValueError("engine.kind vllm serves mixed workers only: use layout colocated or auto")
    if cfg.backend != "local":
        raise ValueError("engine.kind vllm runs with backend 'local' (the Ray backend builds torch engines)")
    if cfg.model == "tiny":
        raise ValueError(f"engine.kind vllm: model {cfg.model!r} has no Hugging Face folder for vLLM; "
                         "use model: smollm2-135m or a model folder")


_HOST_PORT = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]):([0-9]{1,5})")


def borrow_needs_local_ray(addr: str) -> str:
    """The refusal of `policy.borrow` on a joined Ray cluster (ray_address, or RAY_ADDRESS)."""
    return (f"policy.borrow on backend ray lends the trainer's core to Ray actors on this host: it needs the "
            f"local Ray instance, not the cluster at {addr!r} (leave ray_address and RAY_ADDRESS unset, or "
            "set policy.borrow: false)")


def _check_ray_address(addr: str, backend: str) -> None:
    if backend != "ray":
        raise ValueError(f"ray_address {addr!r} is set but backend is {backend!r}; set backend: ray")
    if addr.startswith("ray://"):
        raise ValueError(f"ray_address {addr!r}: Ray Client (ray://) is not supported; give the head's "
                         "address HOST:PORT (its GCS port, 6379 by default) or auto")
    m = _HOST_PORT.fullmatch(addr)
    if addr != "auto" and not (m and 1 <= int(m.group(1)) <= 65535):
        raise ValueError(f"ray_address {addr!r}: expected auto or HOST:PORT (the Ray head's address, port 1 to 65535)")


def parse_train_config(data: dict[str, Any] | None, what: str = "train config") -> TrainConfig:
    return parse_config(data, TrainConfig, what)


def check_names(cfg: TrainConfig) -> None:
    """Unknown model / environment, a missing or bad profile -> a one-line PearlError, before any
    loading. (Lengths past the model's context are checked by `TrainConfig` itself.)"""
    from pearl.envs.loader import resolve
    from pearl.real.folders import read_folder_config
    from pearl.real.models import SOURCES, is_model_path
    from pearl.errors import UnknownNameError

    if cfg.model not in SOURCES:
        if not is_model_path(cfg.model):
            raise UnknownNameError("model", cfg.model, list(SOURCES))
        read_folder_config(cfg.model)  # no folder, no config.json, no weights ... -> one line
    resolve(cfg.env.name)
    if cfg.engine.kind == "vllm":
        import importlib.util

        from pearl.errors import ResourceError
        from pearl.real.vllm_engine import VLLM_MISSING

        if importlib.util.find_spec("vllm") is None:
            raise ResourceError(VLLM_MISSING)
    if cfg.profile:
        from pearl.perf.profile import load_profile

        load_profile(cfg.profile)  # missing or bad file -> one-line ConfigError, before the model loads


def model_context(model: str) -> int | None:
    """The positions `model` can attend over (its max_position_embeddings), if known; a model folder's
    from its config.json."""
    if model in MODEL_CONTEXT:
        return MODEL_CONTEXT[model]
    from pearl.real.folders import folder_context

    return folder_context(model)


def default_config_text() -> str:
    return (importlib.resources.files("pearl") / "data" / "train_default.yaml").read_text()


def load_train_config(config_path: Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    import yaml

    if config_path is None:
        data, what = yaml.safe_load(default_config_text()) or {}, "train config (default)"
    else:
        data, what = read_yaml(config_path), str(config_path)
    if overrides:
        data, what = deep_merge(data, overrides), f"{what} (with overrides)"
    cfg = parse_train_config(data, what)
    check_names(cfg)
    return cfg
