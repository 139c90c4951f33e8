"""The engine interface and `engine.kind` selection, without vLLM: these run in every environment."""
from __future__ import annotations

import importlib.util

import pytest

from pearl.errors import ResourceError
from pearl.real.engine import TorchEngine
from pearl.real.engine_api import RolloutEngine
from pearl.real.models import load_model
from pearl.real.sampling import SamplingParams
from pearl.runtime.agent import AgentLoop
from pearl.runtime.train_config import check_names, parse_train_config
from pearl.types import Role

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_torch_engine_satisfies_the_protocol_the_agent_loop_uses():
    eng = TorchEngine(load_model("tiny"), kv_capacity_tokens=1024)
    assert isinstance(eng, RolloutEngine)
    assert eng.supports_kv_transfer and set(eng.roles) == {Role.MIXED, Role.PREFILL, Role.DECODE}
    eng.close()  # nothing to release, but callable
    import inspect

    ann = inspect.signature(AgentLoop.__init__).parameters["engines"].annotation
    assert "RolloutEngine" in str(ann) and "TorchEngine" not in str(ann)


def test_a_worker_added_later_gets_the_current_weights():
    loaded = load_model("tiny")
    a = TorchEngine(loaded, kv_capacity_tokens=1024)
    loop = AgentLoop([a], "colocated", lambda: None, SamplingParams(), 2, None)
    sd = {k: v.clone() * 1.1 for k, v in loaded.hf_model.state_dict().items()}
    loop.offer_weights(sd, 3)
    loop.apply_weights()
    b = TorchEngine(load_model("tiny"), kv_capacity_tokens=1024)  # its own copy, version 0
    loop.add_engine(b)
    assert b.version == 3
    out_a = a.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))[0]
    out_b = b.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))[0]
    assert out_a.token_ids == out_b.token_ids and out_a.logprobs == pytest.approx(out_b.logprobs, abs=1e-5)


def test_engine_kind_defaults_to_torch_and_accepts_vllm():
    assert parse_train_config({}).engine.kind == "torch"
    cfg = parse_train_config({"model": "smollm2-135m", "engine": {"kind": "vllm"}})
    assert cfg.engine.kind == "vllm"


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_vllm_missing_is_one_clear_line():
    cfg = parse_train_config({"model": "smollm2-135m", "engine": {"kind": "vllm"}})
    with pytest.raises(ResourceError, match=r"^engine.kind: vllm needs the vllm extra: make setup-vllm$"):
        check_names(cfg)
