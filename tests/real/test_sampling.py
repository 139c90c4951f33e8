"""Sampling: greedy, seeded draws, top-p, masks, and which log-prob is reported."""
import pytest
import torch

from pearl.errors import ConfigError
from pearl.real.sampling import Sampler, SamplingParams, _top_p

V = 50


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, V, generator=g) * 3


def test_greedy_takes_argmax_and_reports_untempered_logprob(logits):
    toks, lps = Sampler(V).sample(logits, [SamplingParams(temperature=0)] * 4, [1, 2, 3, 4])
    assert toks == logits.argmax(-1).tolist()
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(toks)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lps), want)


def test_logprob_is_of_the_tempered_distribution_sampled_from(logits):
    p = SamplingParams(temperature=0.7, seed=1)
    toks, lps = Sampler(V).sample(logits, [p] * 4, [5] * 4)
    want = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(toks)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lps), want, atol=1e-6)


def test_seeded_draws_depend_only_on_seed_and_position(logits):
    p = SamplingParams(temperature=1.0, seed=42)
    s1, s2 = Sampler(V, seed=0), Sampler(V, seed=99)
    a = s1.sample(logits, [p] * 4, [7, 7, 7, 7])[0]
    s1.sample(logits, [SamplingParams(temperature=1.0)] * 4, [0] * 4)  # unseeded traffic in between
    b = s2.sample(logits, [p] * 4, [7, 7, 7, 7])[0]
    assert a == b
    many = {tuple(Sampler(V).sample(logits[:1], [p], [pos])[0]) for pos in range(40)}
    assert len(many) > 1  # different positions draw differently


def test_top_p_keeps_the_nucleus_and_renormalises():
    lp = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = _top_p(lp, 0.75)
    assert torch.isinf(kept[2:]).all()
    assert torch.allclose(kept[:2].exp(), torch.tensor([0.625, 0.375]))
    toks, lps = Sampler(4).sample(lp[None].repeat(200, 1), [SamplingParams(top_p=0.75)] * 200, [0] * 200)
    assert set(toks) <= {0, 1} and all(lp_ in (pytest.approx(-0.4700, abs=1e-3), pytest.approx(-0.9808, abs=1e-3))
                                       for lp_ in lps)


def test_allowed_tokens_mask_applies_to_greedy_and_sampling(logits):
    allowed = (3, 17, 40)
    for p in (SamplingParams(temperature=0, allowed_token_ids=allowed),
              SamplingParams(temperature=1.0, seed=5, allowed_token_ids=allowed)):
        toks, lps = Sampler(V).sample(logits, [p] * 4, [0] * 4)
        assert set(toks) <= set(allowed)
        masked = logits[:, list(allowed)]
        lsm = torch.log_softmax(masked, -1)
        for b, t in enumerate(toks):
            assert lps[b] == pytest.approx(float(lsm[b, allowed.index(t)]), abs=1e-5)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        Sampler(V).sample(logits, [SamplingParams(allowed_token_ids=(V + 1,))] * 4, [0] * 4)


def test_bad_params_are_config_errors():
    for kw in ({"temperature": -1}, {"top_p": 1.5}, {"max_new_tokens": 0}, {"allowed_token_ids": ()}):
        with pytest.raises(ConfigError):
            SamplingParams(**kw)
    assert SamplingParams(stop="###").stop == ("###",)
