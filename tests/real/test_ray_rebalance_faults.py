"""A Ray worker that joins mid-batch takes its share of the turns in flight (`Routing.rebalance`),
each moved with its KV (`migrate_out` on the old worker, `submit` on the new one). Here one end of
the first such hand-off is killed (SIGKILL of its process) at the worst moment: after the request
left the old worker and before the new one has it. The run still completes, and every admitted
trajectory is trained, failed, stale or unfinished, none twice."""
import json
import os
import signal
import time

import pytest
from rich.console import Console

from pearl.runtime.training import run_training

pytest.importorskip("transformers")
ray = pytest.importorskip("ray")

# turns of up to 8 free-text tokens (not the default one action token): a turn stays on its worker for several
# engine steps, so the worker that joins finds turns in flight to take over. The trainer on both cores: on
# the one core the actor leaves it (the thread plan since 2026-12-06) it was the bottleneck, the rollout
# sat waiting for it, and the joining worker found nothing in flight (2 of 2 runs)
BASE = {"threads": {"trainer": 2}, "prompts_per_step": 2, "group_size": 4, "rollout_workers": 1, "layout": "colocated",
        "backend": "ray",
        "sampling": {"max_new_tokens": 8, "restrict_actions": False},
        "policy": {"decision_interval_s": 0.5, "min_dwell_s": 1.0, "elastic": True}}


def _gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} outlived SIGKILL")


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["old worker", "new worker"])
def test_a_worker_killed_mid_hand_off_of_a_rebalance_loses_nothing(tmp_path, monkeypatch, victim):
    from pearl.runtime.ray_loop import RayAgentLoop

    killed: list[tuple[str, int]] = []
    move = RayAgentLoop._move

    def kill_mid_hand_off(self, src, dst, ep, rid):
        if not killed and rid is not None:  # the first turn in flight that moves
            old = self.engines[src]
            pid = old.pid if victim == "old worker" else self.engines[dst].pid
            take = old.migrate_out

            def out_then_kill(r):
                m = take(r)  # the request (and its KV) left the old worker ...
                os.kill(pid, signal.SIGKILL)  # ... and one end dies before the new worker has it
                _gone(pid)
                killed.append((victim, pid))
                old.migrate_out = take
                return m

            old.migrate_out = out_then_kill
        return move(self, src, dst, ep, rid)

    monkeypatch.setattr(RayAgentLoop, "_move", kill_mid_hand_off)
    trace = tmp_path / "trace.csv"  # one elastic device from 1 s on, for the whole run
    trace.write_text("t_add,t_remove,count,notice_s\n1,100000,1,\n")
    out = tmp_path / "run"
    # an actor takes 10-40 s to start on this shared machine; 250 steps (0.3-1 s each) outlast it
    s = run_training(None, {**BASE, "max_steps": 250, "elastic": {"trace": {"kind": "csv", "csv": str(trace)}}},
                     out, Console(file=open("/dev/null", "w")))
    assert killed and killed[0][0] == victim, "no turn in flight moved to the new worker"
    assert s["steps"] == 250 and s["ray_workers_lost"] >= 1
    c = s["trajectories"]
    assert c["ok"] + c["failed"] + c["stale"] + s["trajectories_unfinished"] == s["trajectories_admitted"], s
    assert c["ok"] + c["failed"] + c["stale"] == 250 * 8
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    ids = [(r["group"], r["sample"]) for r in rows]
    assert len(ids) == len(set(ids)), "a trajectory was trained twice"
