"""Thread allocation per role (`pearl.runtime.threads`) and the precision settings of `pearl train`."""
import json
import threading

import pytest
import torch
from rich.console import Console

from pearl.runtime.threads import plan_threads
from pearl.runtime.train_config import parse_train_config

pytest.importorskip("transformers")


def test_auto_plan_gives_each_worker_one_thread_and_the_trainer_the_rest():
    assert (plan_threads(2, 1).trainer, plan_threads(2, 1).engine) == (1, 1)
    p = plan_threads(16, 2)
    assert (p.trainer, p.engine, p.interop, p.source) == (14, 1, 1, "auto")
    assert plan_threads(16, 0).trainer == 16  # Ray workers run elsewhere
    assert plan_threads(1, 4).trainer == 1  # never below one
    p = plan_threads(16, 2, trainer=3, engine=2)
    assert (p.trainer, p.engine, p.source) == (3, 2, "config")
    assert plan_threads(16, 2, engine=4).trainer == 8


def test_engine_sets_its_thread_count_on_the_thread_that_steps_it():
    from pearl.real.engine import TorchEngine
    from pearl.real.models import load_model

    before = torch.get_num_threads()
    eng = TorchEngine(load_model("tiny"), num_threads=1)
    eng.add_request([1, 2, 3])
    seen = []

    def other() -> None:
        torch.set_num_threads(2)
        eng.step()
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    torch.set_num_threads(before)
    assert seen == [1]


def test_top_level_dtype_sets_both_roles_and_a_role_overrides_it():
    c = parse_train_config({"dtype": "bfloat16"})
    assert (c.trainer.dtype, c.engine.dtype) == ("bfloat16", "bfloat16")
    assert c.trainer.lr == parse_train_config({}).trainer.lr  # the run's trainer defaults are kept
    c = parse_train_config({"dtype": "bfloat16", "engine": {"dtype": "float32"}})
    assert (c.trainer.dtype, c.engine.dtype) == ("bfloat16", "float32")
    c = parse_train_config({})
    assert (c.trainer.dtype, c.engine.dtype) == ("float32", "float32")


def test_bfloat16_run_trains_and_reports_its_threads(tmp_path):
    from pearl.runtime.training import run_training

    out = tmp_path / "log.txt"
    with open(out, "w") as f:
        s = run_training(None, {"max_steps": 2, "prompts_per_step": 2, "group_size": 4, "dtype": "bfloat16",
                                "threads": {"trainer": 1}}, tmp_path / "run", Console(file=f, width=300))
    assert s["final_version"] == 2
    text = out.read_text()
    assert "threads: trainer 1, 1 per rollout worker" in text and "dtype trainer bfloat16, engines bfloat16" in text
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert abs(lines[0]["ratio_mean"] - 1) < 0.05  # on-policy step: engine and trainer log-probs agree in bf16
