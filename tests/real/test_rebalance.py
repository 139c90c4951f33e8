"""A worker that joins mid-batch (a lent trainer device, an elastic one) takes its share of the
episodes in flight: turns in flight move with their KV, episodes between turns start their next turn
there; nothing is lost or changed (with a run seed, sampled tokens equal those of a run without the
new worker)."""
from __future__ import annotations

import pytest

from pearl.envs import StepResult
from pearl.real.engine import TorchEngine
from pearl.real.models import load_model
from pearl.real.sampling import SamplingParams
from pearl.rl.trajectory import Status
from pearl.runtime.agent import AgentLoop

pytest.importorskip("transformers")


class ThreeTurns:
    system_prompt = "Say something."
    allowed_actions: list[str] = []
    max_turns = 3

    def reset(self, seed: int) -> str:
        self.n, self.seed = 0, seed
        return f"Start {seed}."

    def step(self, text: str) -> StepResult:
        self.n += 1
        return StepResult(f"Turn {self.n}.", 0.5, self.n >= 3, {})


def _rollout(join_after: int | None):
    loaded = load_model("tiny")
    params = SamplingParams(temperature=1.0, max_new_tokens=6, ignore_eos=True)  # seeded per trajectory
    loop = AgentLoop([TorchEngine(loaded, kv_capacity_tokens=4096, seed=1)], "colocated", ThreeTurns, params, 4,
                     10.0, seed=7)
    for g in range(2):
        loop.start_group(g, g)
    done, steps = [], 0
    moved = 0
    while len(done) < 2:
        if steps == join_after:
            loop.add_engine(TorchEngine(loaded, kv_capacity_tokens=4096, seed=2))
            moved = loop.rebalanced
        done += loop.step()
        steps += 1
    trajs = {t.id: t for g in done for t in g.trajs}
    out = (trajs, moved, [e.stats.tokens_decoded for e in loop.engines])
    loop.close()
    return out


def test_a_worker_joining_mid_batch_takes_half_the_episodes_and_changes_no_sampled_token():
    alone, _, _ = _rollout(None)
    trajs, moved, decoded = _rollout(join_after=4)  # mid-turn: some requests are decoding
    assert moved == 4  # 8 episodes, 2 workers
    assert decoded[1] > 0 and decoded[0] > 0
    assert set(trajs) == set(alone)
    for tid, t in trajs.items():
        assert t.status is Status.OK and t.turns == 3
        # moved with its KV or re-prefilled on another worker with another engine seed: the same
        # tokens, because each trajectory samples from its own seed
        assert t.token_ids == alone[tid].token_ids, tid


def test_a_worker_joining_a_prefill_decode_layout_as_decode_takes_no_turn_starts():
    loaded = load_model("tiny")
    from pearl.types import Role
    pre, dec = TorchEngine(loaded, role=Role.PREFILL), TorchEngine(loaded, role=Role.DECODE)
    loop = AgentLoop([pre, dec], "1P:1D", ThreeTurns, SamplingParams(max_new_tokens=4), 4, 10.0)
    loop.start_group(0, 0)
    loop.add_engine(TorchEngine(loaded, role=Role.DECODE))  # starts no turn: nothing to rebalance
    assert loop.rebalanced == 0 and all(ep.engine == 0 for ep in loop.episodes.values())
    loop.close()


@pytest.mark.parametrize("gap", [0, 3])
def test_turns_wait_while_no_worker_serves_and_the_next_worker_takes_them(gap):
    """A switch that stops the only worker before its successor starts (tp 2 -> two workers): requests
    in flight are parked, turns whose environment step ends meanwhile wait; none fails, nothing raises,
    and the next worker finishes every trajectory with the tokens of a run that never switched."""
    alone, _, _ = _rollout(None)
    loaded = load_model("tiny")
    params = SamplingParams(temperature=1.0, max_new_tokens=6, ignore_eos=True)
    loop = AgentLoop([TorchEngine(loaded, kv_capacity_tokens=4096, seed=1)], "colocated", ThreeTurns, params, 4,
                     10.0, seed=7)
    done = [*loop.start_group(0, 0), *loop.start_group(1, 1)]
    for _ in range(4):
        done += loop.step()
    loop.stop_engine(0, migrate=True)
    for _ in range(gap):  # nothing serves: environment results come back, turns wait
        done += loop.step()
    assert loop.parked or loop.waiting
    loop.add_engine(TorchEngine(loaded, kv_capacity_tokens=4096, seed=2))
    while len(done) < 2:
        done += loop.step()
    trajs = {t.id: t for g in done for t in g.trajs}
    assert set(trajs) == set(alone) and not loop.parked and not loop.waiting
    for tid, t in trajs.items():
        assert t.status is Status.OK and t.turns == 3 and t.token_ids == alone[tid].token_ids, tid
    loop.close()
