"""Batched decode attention (padded K/V over several single-token decodes) against transformers."""
import pytest
import torch

from pearl.real.kvcache import KVCache
from pearl.real.modeling import Decoder, SeqChunk
from pearl.real.models import load_model


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny")


def ref_last(lm, ids):
    with torch.no_grad():
        return lm.hf_model(torch.tensor([ids])).logits[0, -1]


def test_ragged_decode_steps_with_mixed_prefill_and_truncation(lm):
    dec = Decoder.from_hf(lm.hf_model)
    kv = KVCache(dec.kv_layout())
    seqs = {"a": [5, 9, 2], "b": [3, 1, 4, 1, 5, 9, 2, 6], "c": [7] * 13}
    dec.forward([SeqChunk(k, 0, v, False) for k, v in seqs.items()], kv)
    for step in range(6):
        names = list(seqs) if step != 2 else ["c", "a", "b"]  # slot order changes once
        chunks = [SeqChunk(k, len(seqs[k]), [10 + step], True) for k in names]
        if step == 3:  # a mixed step: a new session prefills next to the decodes
            seqs["d"] = [4, 4, 8, 15]
            chunks.insert(1, SeqChunk("d", 0, seqs["d"], True))
            names.insert(1, "d")
        if step == 4:  # roll "b" back two positions and redo them as a decode of one token
            kv.truncate("b", len(seqs["b"]) - 2)
            seqs["b"] = seqs["b"][:-2]
            chunks = [c if c.session != "b" else SeqChunk("b", len(seqs["b"]), [10 + step], True) for c in chunks]
        out = dec.forward(chunks, kv)
        for c in chunks:
            seqs[c.session] = seqs[c.session] + (c.token_ids if c.start else [])
        for row, c in zip(out, chunks):
            assert torch.allclose(row, ref_last(lm, seqs[c.session]), atol=1e-5), (step, c.session)
        for k in seqs:
            assert kv.length(k) == len(seqs[k]) and kv.token_ids(k) == seqs[k]
