"""Any Hugging Face model folder by path: a tiny random Llama / Qwen2 saved by transformers with a BPE
tokenizer made here (offline) loads for the engine and the trainer, trains for 2 steps on a JSONL
prompt file with a reward function by path, and a broken folder is one line."""
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

pytest.importorskip("transformers")

from pearl.errors import ConfigError, UnknownNameError  # noqa: E402
from pearl.real.models import load_model  # noqa: E402
from pearl.runtime.train_config import load_train_config, model_context  # noqa: E402
from pearl.runtime.training import run_training  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = ["What is 12 + 7? Write the final answer after ####.", "#### 19", "17 + 25 = 42", "0123456789 +-*=#"]


def make_folder(dest: Path, family: str) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    import torch

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXT * 4, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<unk>", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", unk_token="<unk>")
    cls, model_cls = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    cfg = cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, eos_token_id=tok.eos_token_id,
              tie_word_embeddings=family == "qwen2")
    torch.manual_seed(0)
    model_cls(cfg).save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def folder(request, tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp(request.param) / "model", request.param)


def test_folder_loads_with_its_shape_and_tokenizer(folder):
    loaded = load_model(str(folder))
    assert loaded.spec.shape.num_layers == 2 and loaded.spec.shape.hidden == 32
    tok = loaded.tokenizer
    assert tok.decode(tok.encode("17 + 25 = 42")) == "17 + 25 = 42"
    ids = tok.chat([{"role": "user", "content": "hi"}])  # no chat template: ChatML markers as text
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert model_context(str(folder)) == 256


def test_folder_trains_two_steps_on_jsonl_with_reward_by_path(folder, tmp_path):
    over = {"name": "folder", "model": {"path": str(folder)}, "max_steps": 2, "prompts_per_step": 2,
            "group_size": 4, "rollout_workers": 1,
            "env": {"name": "dataset", "use_system_prompt": False, "kwargs": {
                "path": str(ROOT / "examples" / "arith.jsonl"),
                "reward": f"{ROOT / 'examples' / 'arith_reward.py'}:exact_match"}},
            "sampling": {"max_new_tokens": 8, "restrict_actions": False, "temperature": 1.0},
            "engine": {"kv_capacity_tokens": 4096}}
    (tmp_path / "t.yaml").write_text(json.dumps(over))  # a whole config (JSON is YAML): no default merged in
    summary = run_training(tmp_path / "t.yaml", None, tmp_path / "run", Console(file=open("/dev/null", "w")))
    assert summary["steps"] == 2 and summary["trajectories"]["ok"] >= 8
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert (tmp_path / "run" / "policy" / "config.json").is_file()


@pytest.mark.parametrize("breakage, match", [
    ("missing", "no such folder"),
    ("config.json", "no config.json in the folder"),
    ("model.safetensors", r"no \*.safetensors weights"),
    ("tokenizer.json", "no tokenizer files"),
    ("model_type", "model_type 'gpt2' is not supported; supported: llama, qwen2, qwen3"),
])
def test_broken_folder_is_one_line(folder, tmp_path, breakage, match):
    bad = tmp_path / "bad"
    if breakage != "missing":
        shutil.copytree(folder, bad)
        if breakage == "model_type":
            cfg = json.loads((bad / "config.json").read_text())
            (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
        else:
            (bad / breakage).unlink()
    with pytest.raises(ConfigError, match=match) as info:
        load_train_config(None, {"model": str(bad)})
    assert "\n" not in str(info.value)


def test_a_name_that_is_not_a_path_is_still_unknown():
    with pytest.raises(UnknownNameError, match="unknown model 'gpt5'"):
        load_train_config(None, {"model": "gpt5"})
    with pytest.raises(ConfigError, match="expected a model name, a folder path, or"):
        load_train_config(None, {"model": {"name": "x"}})


def _smollm2_or_skip():
    from pearl.errors import ResourceError
    from pearl.real.models import find_smollm2_gguf

    try:
        find_smollm2_gguf()
    except ResourceError as err:
        pytest.skip(str(err))


def test_convert_gguf_writes_the_embedded_smollm2_as_a_folder(tmp_path, capsys):
    from pearl.cli import main
    from pearl.perf.models import MODELS
    from pearl.real.folders import read_folder_config
    from pearl.perf.models import model_from_hf_config

    _smollm2_or_skip()
    out = tmp_path / "smol"
    with pytest.raises(SystemExit) as ei:
        main(["convert-gguf", str(out)])
    assert ei.value.code == 0 and f"saved {out}" in "".join(capsys.readouterr().out.split()).replace("saved", "saved ")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    shape = model_from_hf_config(read_folder_config(str(out)), "smollm2-135m", dtype="float32")
    assert shape == MODELS["smollm2-135m"]
    assert model_context(str(out)) == 8192


@pytest.mark.slow
def test_converted_smollm2_folder_generates_like_the_embedded_model(tmp_path):
    import torch

    from pearl.real.models import convert_gguf

    _smollm2_or_skip()
    folder = convert_gguf(tmp_path / "smol")
    a, b = load_model("smollm2-135m"), load_model(str(folder))
    ids = a.tokenizer.chat([{"role": "user", "content": "What is 2 + 3?"}])
    assert b.tokenizer.chat([{"role": "user", "content": "What is 2 + 3?"}]) == ids
    x = torch.tensor([ids])
    with torch.no_grad():
        ga = a.hf_model.generate(x, max_new_tokens=8, do_sample=False)
        gb = b.hf_model.generate(x, max_new_tokens=8, do_sample=False)
    assert ga.tolist() == gb.tolist()


def test_the_readme_config_trains_with_a_folder(folder, tmp_path, monkeypatch):
    """README "Bring your model and your data": its my-task.yaml, with this tiny folder for the model
    and 2 steps, runs from the repository root."""
    import re

    import yaml

    text = (ROOT / "README.md").read_text()
    section = text.split("## Bring your model and your data", 1)[1]
    cfg = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    assert cfg["model"] == "models/smollm2-135m" and cfg["env"]["name"] == "dataset"
    cfg.update(model=str(folder), max_steps=2, group_size=4)
    (tmp_path / "my-task.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(ROOT)
    summary = run_training(tmp_path / "my-task.yaml", None, tmp_path / "run", Console(file=open("/dev/null", "w")))
    assert summary["steps"] == 2 and summary["trajectories"]["failed"] == 0
