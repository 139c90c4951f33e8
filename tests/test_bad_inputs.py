"""Every bad input is one line on stderr (`error: ...`), exit code 2, no traceback; checked before any
work. One case per row of docs/bad-inputs.md (the `id` column), run in-process through
`pearl.cli.main` from a scratch directory, so messages name files as the user typed them."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "bad-inputs.md"

# A small valid scenario (used where the bad part is an option or an override).
OK = ("name: ok\nduration_s: 60\ncluster: {rollout_devices: 2, train_devices: 1}\n"
      "workload: {profile: game}\nrl: {prompts_per_batch: 2, group_size: 4}\n")
BINARY = b"\x00\xff\xfe\x80PK\x03\x04"

SIM = "simulate s.yaml --out r.json"  # `sim` cases: the body is s.yaml
TRAIN = "train t.yaml --out run"  # `train` cases: the body is t.yaml

# (id, how, input, needles): how is "sim" / "train" (input: the file's body) or "cli" (input: argv)
CASES: list[tuple[str, str, str | bytes, tuple[str, ...]]] = [
    # ---- files
    ("empty-file", "sim", "", ("s.yaml: the file is empty",)),
    ("comments-only", "sim", "# nothing here\n", ("s.yaml: the file is empty",)),
    ("binary-file", "sim", BINARY, ("s.yaml: not a text file",)),
    ("top-level-list", "sim", "- 1\n- 2\n", ("s.yaml: expected a mapping", "got a list")),
    ("top-level-scalar", "sim", "42\n", ("s.yaml: expected a mapping", "got an integer")),
    ("missing-file", "cli", "simulate nope.yaml", ("nope.yaml: file not found",)),
    ("directory-as-file", "cli", "simulate adir", ("adir: is a directory",)),
    ("invalid-yaml", "sim", "cluster: [1, 2\n", ("s.yaml: line", "is not valid YAML")),
    ("duplicate-key", "sim", "seed: 1\nseed: 2\n", ("duplicate key 'seed'",)),
    ("unknown-field", "sim", "clustr: {rollout_devices: 3}\n", ("unknown field 'clustr'",)),
    ("unknown-nested-field", "sim", "cluster: {rollout_devicez: 3}\n", ("unknown field 'cluster.rollout_devicez'",)),
    ("wrong-nested-type", "sim", "cluster: big\n", ("'cluster' = 'big'", "valid dictionary")),
    # ---- sizes: bounded, exact integers
    ("devices-10e30", "sim", "cluster: {rollout_devices: 1000000000000000000000000000000}\n",
     ("'cluster.rollout_devices'", "less than or equal to 65536")),
    ("devices-1e9", "sim", "cluster: {rollout_devices: 1000000000}\n",
     ("'cluster.rollout_devices' = 1000000000", "65536")),
    ("devices-expression", "sim", "cluster: {rollout_devices: 10**30}\n",
     ("'cluster.rollout_devices' = '10**30'", "expected an integer, got a string")),
    ("devices-bool", "sim", "cluster: {rollout_devices: yes}\n",
     ("'cluster.rollout_devices' = True", "expected an integer, got a boolean")),
    ("devices-float", "sim", "cluster: {rollout_devices: 8.0}\n",
     ("'cluster.rollout_devices' = 8.0", "expected an integer, got a float")),
    ("devices-string", "sim", "cluster: {rollout_devices: '8'}\n",
     ("'cluster.rollout_devices' = '8'", "expected an integer, got a string")),
    ("devices-negative", "sim", "cluster: {rollout_devices: -2}\n",
     ("'cluster.rollout_devices' = -2", "greater than or equal to 0")),
    ("train-devices-zero", "sim", "cluster: {train_devices: 0}\n", ("'cluster.train_devices' = 0",)),
    ("devices-per-node-huge", "sim", "cluster: {devices_per_node: 100000}\n",
     ("'cluster.devices_per_node' = 100000", "less than or equal to 256")),
    ("max-num-seqs-huge", "sim", "engine: {max_num_seqs: 1000000000}\n", ("'engine.max_num_seqs' = 1000000000",)),
    ("tp-zero", "sim", "engine: {tp: 0}\n", ("'engine.tp' = 0",)),
    ("tp-beyond-node", "sim", "cluster: {rollout_devices: 16}\nengine: {tp: 16}\n",
     ("engine.tp (16) is larger than cluster.devices_per_node (8)",)),
    ("group-size-huge", "sim", "rl: {group_size: 100000}\n", ("'rl.group_size' = 100000",)),
    ("batch-huge", "sim", "rl: {prompts_per_batch: 100000, group_size: 100}\n",
     ("rl.prompts_per_batch x rl.group_size = 10000000",)),
    ("max-train-steps-huge", "sim", "max_train_steps: 1000000000000\n", ("'max_train_steps' = 1000000000000",)),
    ("seed-negative", "sim", "seed: -1\n", ("'seed' = -1",)),
    # ---- durations and numbers: finite, bounded
    ("duration-inf", "sim", "duration_s: .inf\n", ("'duration_s' = inf", "finite")),
    ("duration-nan", "sim", "duration_s: .nan\n", ("'duration_s' = nan", "finite")),
    ("duration-over-a-year", "sim", "duration_s: 1.0e9\n", ("'duration_s' = '1.0e9'", "less than or equal to 31536000")),
    ("duration-zero", "sim", "duration_s: 0\n", ("'duration_s' = 0", "greater than 0")),
    ("duration-bool", "sim", "duration_s: yes\n", ("'duration_s' = True", "expected a number, got a boolean")),
    ("controller-negative", "sim", "policy: {controller: {wake_s: -1}}\n", ("'policy.controller.wake_s' = -1",)),
    ("estimate-window-zero", "sim", "policy: {controller: {estimate: {window: 0}}}\n",
     ("'policy.controller.estimate.window' = 0", "greater than or equal to 1")),
    ("estimate-prior-bool", "sim", "policy: {controller: {estimate: {prior_turns: yes}}}\n",
     ("'policy.controller.estimate.prior_turns' = True", "valid number")),
    ("distribution-huge", "sim", "workload: {response_tokens: {kind: constant, value: 1.0e+30}}\n",
     ("'workload.response_tokens.value' = 1e+30",)),
    ("distribution-p90-below-median", "sim", "workload: {response_tokens: {median: 100, p90: 50}}\n",
     ("'workload.response_tokens'", "p90 (50.0) must be >= median (100.0)")),
    # ---- names and enums
    ("tps-3", "sim", "policy: {name: pearl, tps: [3]}\n", ("'policy.tps' = [3]", "tensor-parallel size 3")),
    ("tps-empty", "sim", "policy: {tps: []}\n", ("'policy.tps' = []", "at least one")),
    ("tps-duplicate", "sim", "policy: {tps: [2, 2]}\n", ("'policy.tps' = [2, 2]", "give distinct tensor-parallel sizes")),
    ("tps-not-dividing-node", "sim", "cluster: {devices_per_node: 6, rollout_devices: 6}\npolicy: {tps: [4]}\n",
     ("policy.tps: 4 does not divide cluster.devices_per_node (6)",)),
    ("side-tp-not-smaller", "sim", "engine: {tp: 2}\npolicy: {name: rlboost+, side_tp: 2}\n",
     ("policy.side_tp (2) must divide engine.tp (2) and be smaller",)),
    ("flag-not-bool", "sim", "policy: {borrow: 'yes'}\n", ("'policy.borrow' = 'yes'", "expected true or false")),
    ("unknown-policy", "sim", "policy: {name: greedy}\n", ("'policy.name' = 'greedy'", "'pearl'")),
    ("unknown-layout-mode", "sim", "layout: {mode: pd}\n", ("'layout.mode' = 'pd'", "'disaggregated'")),
    ("pd-ratio-vs-devices", "sim", "cluster: {rollout_devices: 8}\nlayout: {mode: disaggregated, prefill: 3, decode: 3}\n",
     ("layout 3P:3D at tp=1 needs 6 devices but cluster.rollout_devices is 8",)),
    ("prefill-tp-vs-devices", "sim",
     "cluster: {rollout_devices: 8}\nlayout: {mode: disaggregated, prefill: 1, decode: 3, prefill_tp: 4}\n",
     ("layout 1P@tp4:3D@tp1 needs 7 devices but cluster.rollout_devices is 8",)),
    ("prefill-tp-colocated", "sim", "layout: {mode: colocated, prefill_tp: 2}\n",
     ("layout.prefill_tp is the prefill workers' tensor-parallel size: it needs mode: disaggregated",)),
    ("rollout-mix-unknown-hardware", "sim", "cluster: {rollout_devices: 2, rollout_mix: {gpu: 1}}\n",
     ("s.yaml: cluster.rollout_mix: unknown hardware 'gpu'; known: ",)),
    ("rollout-mix-too-many", "sim", "cluster: {rollout_devices: 2, rollout_mix: {h20: 3}}\n",
     ("cluster.rollout_mix has 3 devices but cluster.rollout_devices is 2",)),
    ("rollout-mix-controller", "sim", "cluster: {rollout_devices: 2, rollout_mix: {h20: 1}}\npolicy: {name: pearl}\n",
     ("cluster.rollout_mix needs policy.name: fixed (got 'pearl')",)),
    ("rollout-mix-split-worker", "sim", "cluster: {rollout_devices: 6, rollout_mix: {h20: 4}}\n"
     "layout: {mode: disaggregated, prefill: 1, decode: 1, prefill_tp: 4}\nengine: {tp: 2}\n",
     ("s.yaml: cluster.rollout_mix: the 4 h20 devices split a worker of the layout (worker sizes [4, 2])",)),
    ("rollout-mix-compare", "cli", "compare mix.yaml", ("mix.yaml: cluster.rollout_mix is for pearl simulate",)),
    ("unknown-model", "sim", "model: qwen9-1t\n", ("unknown model 'qwen9-1t'; known: ",)),
    ("unknown-hardware", "sim", "cluster: {hardware: tpu}\n", ("unknown hardware 'tpu'; known: ",)),
    ("unknown-workload", "sim", "workload: {profile: chess}\n", ("unknown workload profile 'chess'",)),
    ("twin-trajectories-missing", "sim", "twin: {trajectories: nope.jsonl}\n",
     ("trajectories 'nope.jsonl': no such file",)),
    ("twin-trajectories-garbage", "sim", "twin: {trajectories: s.yaml}\n",
     ("trajectories 's.yaml': line 1 is not a recorded trajectory",)),
    ("twin-engine-coeffs-unknown", "sim", "twin: {engine_coeffs: {speed: 2.0}}\n",
     ("field 'twin.engine_coeffs': unknown coefficient 'speed'",)),
    ("elastic-csv-missing", "sim", "cluster: {elastic: {kind: csv, csv: nope.csv}}\n",
     ("cluster.elastic.csv: file not found: nope.csv",)),
    ("elastic-csv-binary", "sim", "cluster: {elastic: {kind: csv, csv: bin.dat}}\n",
     ("'cluster.elastic'", "csv 'bin.dat' is not a readable text file")),
    ("schedule-not-increasing", "sim", "workload: {schedule: [{step: 5}, {step: 2, response: 2}]}\n",
     ("'workload.schedule'", "schedule steps must increase: step 2 follows step 5")),
    ("schedule-factor-negative", "sim", "workload: {schedule: [{step: 0, response: -1}]}\n",
     ("'workload.schedule.0.response' = -1", "greater than 0")),
    ("schedule-step-float", "sim", "workload: {schedule: [{step: 1.5}]}\n",
     ("'workload.schedule.0.step' = 1.5", "valid integer")),
    ("elastic-cold-start-negative", "sim", "cluster: {elastic: {cold_start_s: -1}}\n",
     ("'cluster.elastic.cold_start_s' = -1", "greater than or equal to 0")),
    ("kv-pool-below-context", "sim", "workload: {profile: game}\nengine: {kv_capacity_tokens: 1000}\n",
     ("s.yaml: engine.kv_capacity_tokens (1000) is below the workload's longest context (8192 tokens)",)),
    ("compare-missing-file", "cli", "compare nope.yaml", ("nope.yaml: file not found",)),
    ("compare-seeds-zero", "cli", "compare s.yaml --seeds 0", ("'--seeds'", "0 is out of range")),
    # ---- pearl train
    ("train-empty-file", "train", "", ("t.yaml: the file is empty",)),
    ("train-group-size-1", "train", "group_size: 1\n", ("group_size 1", "allow_single_sample")),
    ("train-past-context", "train", "sampling: {max_new_tokens: 6000, restrict_actions: false}\n",
     ("sampling.max_new_tokens (6000)", "context of model 'tiny' (4096 positions)")),
    ("train-far-past-context", "train", "sampling: {max_new_tokens: 100000}\n",
     ("sampling.max_new_tokens (100000)", "(4096 positions)")),
    ("train-past-kv", "train", "sampling: {max_new_tokens: 2000}\nengine: {kv_capacity_tokens: 1000}\n",
     ("sampling.max_new_tokens (2000)", "engine.kv_capacity_tokens (1000)")),
    ("train-elastic-no-source", "train", "policy: {elastic: true}\n",
     ("policy.elastic needs an elastic: source",)),
    ("train-elastic-nodes-local", "train", "policy: {elastic: true}\nelastic: {ray_nodes: true}\n",
     ("elastic.ray_nodes needs backend: ray",)),
    ("train-elastic-unused", "train", "elastic: {trace: {kind: poisson}}\n",
     ("elastic: devices are used only with policy.elastic: true",)),
    ("train-1p1d-one-worker", "train", "layout: 1P:1D\nrollout_workers: 1\n",
     ("layout '1P:1D' needs rollout_workers >= 2 (got 1)",)),
    ("train-unknown-layout", "train", "layout: 2P:2D\n", ("'layout' = '2P:2D'",)),
    ("train-unknown-engine-kind", "train", "engine: {kind: sglang}\n", ("'engine.kind' = 'sglang'",)),
    ("train-vllm-pd", "train", "model: smollm2-135m\nengine: {kind: vllm}\nlayout: 1P:1D\nrollout_workers: 2\n",
     ("engine.kind vllm serves mixed workers only",)),
    ("train-vllm-tiny", "train", "model: tiny\nengine: {kind: vllm}\n",
     ("engine.kind vllm: model 'tiny' has no Hugging Face folder for vLLM",)),
    ("train-workers-bool", "train", "rollout_workers: yes\n", ("'rollout_workers' = True", "expected an integer")),
    ("train-max-steps-huge", "train", "max_steps: 1000000000000\n", ("'max_steps' = 1000000000000",)),
    ("train-unknown-model", "train", "model: gpt5\n", ("unknown model 'gpt5'; known: smollm2-135m, tiny",)),
    ("train-unknown-env", "train", "env: {name: chess}\n", ("unknown environment 'chess'",)),
    ("train-bad-env-kwargs", "train", "env: {name: gridworld, kwargs: {size: 99}}\n",
     ("env 'gridworld': size must be in [2, 12], got 99",)),
    ("train-missing-profile", "train", "profile: nope.json\n", ("profile 'nope.json': no such file",)),
    ("train-stall-timeout-inf", "train", "stall_timeout_s: .inf\n", ("'stall_timeout_s' = inf", "finite")),
    ("train-checkpoint-every-zero", "train", "checkpoint_every: 0\n", ("'checkpoint_every' = 0",)),
    ("train-policy-not-runnable", "train", "policy: {name: rlboost+}\n", ("policy.name 'rlboost+'",)),
    ("train-tps", "train", "policy: {tps: [4]}\n", ("policy.tps [4]", "tensor-parallel size 1, or 2")),
    ("train-per-role-tp", "train", "policy: {per_role_tp: true}\n", ("policy.per_role_tp", "tensor-parallel size 1")),
    ("train-side-tp", "train", "policy: {side_tp: 1}\n", ("policy.side_tp", "rlboost+ baseline")),
    ("train-lr-nan", "train", "trainer: {lr: .nan}\n", ("'trainer.lr' = nan", "finite")),
    ("train-micro-batch-bool", "train", "trainer: {micro_batch_size: yes}\n",
     ("'trainer.micro_batch_size' = True",)),
    ("train-unknown-backend", "train", "backend: mpi\n", ("'backend' = 'mpi'",)),
    ("train-borrow-joined-ray", "train", "backend: ray\nray_address: auto\npolicy: {borrow: true}\n",
     ("policy.borrow on backend ray", "needs the local Ray instance, not the cluster at 'auto'")),
    ("train-dtype-fp16", "train", "dtype: float16\n", ("'dtype' = 'float16'", "'float32' or 'bfloat16'")),
    ("train-engine-dtype", "train", "engine: {dtype: half}\n", ("'engine.dtype' = 'half'",)),
    ("train-threads-zero", "train", "threads: {trainer: 0}\n", ("'threads.trainer' = 0",)),
    ("train-out-under-a-file", "cli", "train --out afile/run", ("run directory afile/run cannot be written",)),
    ("train-out-is-a-file", "cli", "train --out afile", ("run directory afile is a file",)),
    ("train-out-holds-a-run", "cli", "train --out arun", ("run directory arun already holds a run", "--overwrite")),
    ("train-resume-not-a-run", "cli", "train --resume adir", ("--resume adir: no config.yaml there",)),
    ("train-resume-scalar-config", "cli", "train --resume abad", ("expected a mapping of fields",)),
    ("train-missing-config", "cli", "train nope.yaml --out run", ("nope.yaml: file not found",)),
    ("train-model-folder-missing", "train", "model: ./nope\n", ("model './nope': no such folder",)),
    ("train-model-folder-no-config", "train", "model: adir\n",
     ("model 'adir': no config.json in the folder",)),
    ("train-model-bad-mapping", "train", "model: {name: x}\n", ("expected a model name, a folder path, or {path: DIR}",)),
    ("train-data-missing", "train", "env: {name: dataset, kwargs: {path: nope.jsonl, reward: 'rewards.py:exact'}}\n",
     ("data 'nope.jsonl': no such file",)),
    ("train-data-bad-json", "train", "env: {name: dataset, kwargs: {path: bad.jsonl, reward: 'rewards.py:exact'}}\n",
     ("data 'bad.jsonl' line 2: not valid JSON",)),
    ("train-data-bad-column", "train",
     "env: {name: dataset, kwargs: {path: q.jsonl, reward: 'rewards.py:exact', prompt_field: question}}\n",
     ("data 'q.jsonl': has no column 'question'; columns: prompt, answer",)),
    ("train-reward-unimportable", "train", "env: {name: dataset, kwargs: {path: q.jsonl, reward: 'no_such_mod:f'}}\n",
     ("reward 'no_such_mod:f': cannot import module 'no_such_mod'",)),
    ("train-reward-no-function", "train", "env: {name: dataset, kwargs: {path: q.jsonl, reward: 'rewards.py:nope'}}\n",
     ("reward 'rewards.py:nope': module 'rewards.py' has no attribute 'nope'",)),
    ("train-reward-bad-signature", "train", "env: {name: dataset, kwargs: {path: q.jsonl, reward: 'rewards.py:two'}}\n",
     ("reward 'rewards.py:two': does not accept (completion, prompt, answer)",)),
    ("convert-gguf-not-empty", "cli", "convert-gguf adir2", ("convert-gguf: 'adir2' exists and is not an empty folder",)),
    # ---- options and overrides
    ("plan-devices-abc", "cli", "plan --devices abc", ("'--devices'", "'abc' is not an integer")),
    ("plan-devices-1e30", "cli", "plan --devices 1e30", ("'--devices'", "'1e30' is not an integer")),
    ("plan-devices-huge", "cli", "plan --devices 100000", ("'--devices'", "100000 is out of range (expected 1 to 65536)")),
    ("plan-devices-zero", "cli", "plan --devices 0", ("'--devices'", "0 is out of range")),
    ("plan-devices-no-value", "cli", "plan --devices", ("'--devices' requires an argument",)),
    ("plan-batch-negative", "cli", "plan --batch -5", ("'--batch'", "-5 is out of range")),
    ("plan-tp-3", "cli", "plan --tp 3", ("--tp '3'", "1,2,4,8")),
    ("plan-tp-not-int", "cli", "plan --tp 1,x", ("--tp: expected comma-separated integers, got '1,x'",)),
    ("plan-mix-no-count", "cli", "plan --devices 16 --mix h20", ("--mix 'h20': expected HARDWARE:N with 1 <= N < --devices (16)",)),
    ("plan-mix-every-device", "cli", "plan --devices 16 --mix h20:16", ("--mix 'h20:16'", "1 <= N < --devices (16)")),
    ("plan-mix-same-hardware", "cli", "plan --devices 16 --mix H800:8", ("--mix 'H800:8': H800 is --hardware itself",)),
    ("plan-mix-unknown-hardware", "cli", "plan --devices 16 --mix tpu:8", ("unknown hardware 'tpu'; known: ",)),
    ("plan-unknown-model", "cli", "plan --model gpt5", ("unknown model 'gpt5'; known: ",)),
    ("plan-unknown-option", "cli", "plan --frobnicate 3", ("No such option: --frobnicate",)),
    ("unknown-command", "cli", "simulat s.yaml", ("No such command 'simulat'",)),
    ("missing-argument", "cli", "simulate", ("Missing argument 'scenario'",)),
    ("set-without-equals", "cli", "simulate ok.yaml --set rl.staleness", ("--set expects key=value, got 'rl.staleness'",)),
    ("set-bad-path", "cli", "simulate ok.yaml --set rl..staleness=2", ("--set 'rl..staleness=2'", "not a field path")),
    ("set-bad-yaml", "cli", "simulate ok.yaml --set cluster.rollout_devices=[1,", ("--set", "is not valid YAML")),
    ("set-into-a-value", "cli", "simulate ok.yaml --set cluster=3 --set cluster.train_devices=1",
     ("--set 'cluster.train_devices=1': cluster is already set to a value",)),
    ("set-unknown-field", "cli", "simulate ok.yaml --set rl.stalenes=2", ("ok.yaml (with overrides): unknown field 'rl.stalenes'",)),
    ("set-bool-for-int", "cli", "simulate ok.yaml --set cluster.rollout_devices=yes",
     ("'cluster.rollout_devices' = True",)),
    ("seed-option-negative", "cli", "simulate ok.yaml --seed -1", ("'--seed'", "-1 is out of range")),
    ("duration-option-inf", "cli", "simulate ok.yaml --duration inf", ("'--duration'", "'inf' is not a finite number")),
    ("duration-option-huge", "cli", "simulate ok.yaml --duration 1e9", ("'--duration'", "out of range")),
    ("policy-option-unknown", "cli", "simulate ok.yaml --policy greedy", ("'policy.name' = 'greedy'",)),
    ("simulate-out-is-a-dir", "cli", "simulate ok.yaml --out adir", ("--out 'adir': is a directory",)),
    ("simulate-trace-under-a-file", "cli", "simulate ok.yaml --trace afile/t.json",
     ("--trace 'afile/t.json': 'afile' is not a directory",)),
    ("report-missing-run", "cli", "report nope", ("nope does not exist",)),
    ("simulate-out-under-a-file", "cli", "simulate ok.yaml --out afile/r.json", ("--out 'afile/r.json': 'afile' is not a directory",)),
    ("profile-unknown-model", "cli", "profile --model gpt5", ("unknown model 'gpt5'; known: smollm2-135m, tiny",)),
]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    (tmp_path / "ok.yaml").write_text(OK)
    (tmp_path / "bin.dat").write_bytes(BINARY)
    (tmp_path / "adir").mkdir()
    (tmp_path / "mix.yaml").write_text(OK.replace("train_devices: 1}", "train_devices: 1, rollout_mix: {h20: 1}}"))
    (tmp_path / "afile").write_text("a file\n")
    (tmp_path / "arun").mkdir()  # a directory that holds a run
    (tmp_path / "arun" / "metrics.jsonl").write_text("")
    (tmp_path / "abad").mkdir()  # a run directory whose saved config is not a mapping
    (tmp_path / "abad" / "config.yaml").write_text("just a string\n")
    (tmp_path / "adir2").mkdir()  # a non-empty directory
    (tmp_path / "adir2" / "x").write_text("x\n")
    (tmp_path / "q.jsonl").write_text('{"prompt": "1+1?", "answer": 2}\n')  # a prompt file and reward functions
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1?", "answer": 2}\n{"prompt": \n')
    (tmp_path / "rewards.py").write_text("def exact(completion, answer, **row):\n    return 1.0\n\n"
                                         "def two(completion, expected):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def argv_of(how: str, body: str | bytes, where: Path) -> list[str]:
    if how == "cli":
        assert isinstance(body, str)
        return shlex.split(body)
    name, cmd = ("s.yaml", SIM) if how == "sim" else ("t.yaml", TRAIN)
    f = where / name
    f.write_bytes(body) if isinstance(body, bytes) else f.write_text(body)
    return shlex.split(cmd)


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    cap = capsys.readouterr()
    return ei.value.code, cap.out, cap.err


@pytest.mark.parametrize("case_id, how, body, needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case_id, how, body, needles, scratch, capsys):
    code, _, err = run_main(argv_of(how, body, scratch), capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err)
    assert "Traceback" not in err and "╭" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert len(lines[0]) < 400, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not (scratch / "r.json").exists() and not (scratch / "run" / "summary.json").exists()


def test_the_doc_lists_every_case_and_nothing_else():
    ids = re.findall(r"^\| `([a-z0-9-]+)` \|", DOC.read_text(), flags=re.M)
    assert len(ids) >= 40
    assert len(set(ids)) == len(ids)
    assert set(ids) == {c[0] for c in CASES}


@pytest.mark.parametrize("argv", [["simulate", "s.yaml"], ["plan", "--devices", "1e30"], ["train", "s.yaml"]])
def test_the_installed_entry_point_too(argv, scratch):
    (scratch / "s.yaml").write_bytes(BINARY)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "pearl.cli", *argv], capture_output=True, text=True,
                       cwd=scratch, timeout=120, env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr


def test_help_still_works(capsys):
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0 and "simulate" in out and "train" in out
    code, out, _ = run_main(["plan", "--help"], capsys)
    assert code == 0 and "--devices" in out


# ---------------------------------------------------------------- what is still accepted
def test_explicit_empty_mapping_means_every_default(scratch):
    from pearl.config import ScenarioConfig, load_config

    (scratch / "e.yaml").write_text("{}\n")
    assert load_config("e.yaml", ScenarioConfig) == ScenarioConfig()


def test_a_number_yaml_reads_as_a_string_is_still_a_number():
    from pearl.config import ScenarioConfig, parse_config

    # YAML 1.1 reads `1e3` (no dot) as the string "1e3": a number field takes it
    assert parse_config({"duration_s": "1e3"}, ScenarioConfig).duration_s == 1000.0
    assert parse_config({"duration_s": 600}, ScenarioConfig).duration_s == 600.0


def test_single_sample_groups_with_the_opt_in():
    from pearl.runtime.train_config import parse_train_config

    assert parse_train_config({"group_size": 1, "allow_single_sample": True}).group_size == 1


def test_tps_that_fit(scratch):
    from pearl.config import ScenarioConfig, parse_config

    assert parse_config({"policy": {"tps": [1, 2, 4, 8]}}, ScenarioConfig).policy.tps == [1, 2, 4, 8]


def test_model_contexts_match_the_loaders_configs():
    from pearl.real.models import tiny_config
    from pearl.runtime.train_config import MODEL_CONTEXT
    from pearl.real.models import SOURCES

    assert set(MODEL_CONTEXT) == set(SOURCES)
    assert MODEL_CONTEXT["tiny"] == tiny_config().max_position_embeddings
    cached = sorted((Path.home() / ".cache" / "pearl" / "models").glob("smollm2-135m-*/config.json"))
    if cached:  # the converted SmolLM2 config, when this machine has loaded it once
        import json

        assert MODEL_CONTEXT["smollm2-135m"] == json.loads(cached[0].read_text())["max_position_embeddings"]
