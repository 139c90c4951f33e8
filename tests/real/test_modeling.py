"""Our forward pass against transformers: chunked prefill, ragged batches, weight updates."""
import pytest
import torch

from pearl.errors import ConfigError
from pearl.real.kvcache import KVCache
from pearl.real.modeling import Decoder, SeqChunk
from pearl.real.models import load_model


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny")


def ref_logits(lm, ids):
    with torch.no_grad():
        return lm.hf_model(torch.tensor([ids])).logits[0]


def test_chunked_prefill_matches_full_forward(lm):
    dec = Decoder.from_hf(lm.hf_model)
    ids = list(range(40, 90))
    ref = ref_logits(lm, ids)
    kv = KVCache(dec.kv_layout())
    for a, b in [(0, 7), (7, 8), (8, 31), (31, 50)]:
        out = dec.forward([SeqChunk("s", a, ids[a:b], True)], kv)
        assert torch.allclose(out[0], ref[b - 1], atol=1e-5)
    assert kv.length("s") == 50 and kv.token_ids("s") == ids


def test_ragged_batch_matches_sequences_run_alone(lm):
    dec = Decoder.from_hf(lm.hf_model)
    a, b, c = list(range(30, 52)), list(range(60, 65)), list(range(100, 133))
    kv = KVCache(dec.kv_layout())
    dec.forward([SeqChunk("c", 0, c[:20], False)], kv)  # c already holds 20 positions
    out = dec.forward([SeqChunk("a", 0, a, True), SeqChunk("b", 0, b, False), SeqChunk("c", 20, c[20:], True)], kv)
    assert out.shape[0] == 2  # logits only where a sample is wanted
    assert torch.allclose(out[0], ref_logits(lm, a)[-1], atol=1e-5)
    assert torch.allclose(out[1], ref_logits(lm, c)[-1], atol=1e-5)
    # one decode token each, in one step
    out = dec.forward([SeqChunk("a", 22, [7], True), SeqChunk("b", 5, [8], True)], kv)
    assert torch.allclose(out[0], ref_logits(lm, a + [7])[-1], atol=1e-5)
    assert torch.allclose(out[1], ref_logits(lm, b + [8])[-1], atol=1e-5)


def test_update_from_state_dict_and_reject_foreign_weights(lm):
    dec = Decoder.from_hf(lm.hf_model, version=0)
    other = load_model("tiny").hf_model
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.1)
    dec.load_state_dict(other.state_dict(), version=4)
    assert dec.version == 4
    kv = KVCache(dec.kv_layout())
    out = dec.forward([SeqChunk("s", 0, [1, 2, 3], True)], kv)
    with torch.no_grad():
        want = other(torch.tensor([[1, 2, 3]])).logits[0, -1]
    assert torch.allclose(out[0], want, atol=1e-5)
    # a partial update touches only the named slice of the fused q/k/v matrix
    k_name = "model.layers.1.self_attn.k_proj.weight"
    dec.load_state_dict({k_name: torch.zeros(32, 64)})
    assert dec.layers[1]["qkv"][64:96].abs().sum() == 0 and dec.layers[1]["qkv"][:64].abs().sum() > 0
    with pytest.raises(ConfigError, match="do not belong"):
        dec.load_state_dict({"model.layers.9.mlp.up_proj.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="shape"):
        dec.load_state_dict({k_name: torch.zeros(3, 3)})


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_other_decoder_families_match_transformers(family):
    """Separate lm_head (llama, untied) and q/k/v biases (qwen2) against transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    cfg = cfg_cls(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                  initializer_range=0.2, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    torch.manual_seed(1)
    hf = model_cls(cfg).eval()
    if family == "qwen2":
        with torch.no_grad():
            hf.model.layers[0].self_attn.q_proj.bias.normal_()
    dec = Decoder.from_hf(hf)
    ids = [5, 9, 13, 40, 2, 77, 31, 8]
    kv = KVCache(dec.kv_layout())
    dec.forward([SeqChunk("s", 0, ids[:5], False)], kv)
    out = dec.forward([SeqChunk("s", 5, ids[5:], True)], kv)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1]
    assert torch.allclose(out[0], want, atol=1e-5)
