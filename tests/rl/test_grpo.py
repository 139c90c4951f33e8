import math

import pytest
import torch

from pearl.rl.grpo import group_advantages, k3_kl, policy_loss, token_logprobs


def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    a = 0.5 / math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1] is sqrt(1/3)
    got = group_advantages(r, g, eps=0.0 + 1e-12)
    assert torch.allclose(got, torch.tensor([a, -a, -a, a, 0, 0, 0]), atol=1e-5)
    plain = group_advantages(r, g, normalize_std=False)
    assert torch.allclose(plain, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0]))


def test_group_advantages_unsorted_group_ids():
    got = group_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([7, 3, 7, 3]), eps=1e-12)
    s = 1 / math.sqrt(2)
    assert torch.allclose(got, torch.tensor([-s, -s, s, s]), atol=1e-6)


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="same length"):
        group_advantages(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([float("nan")]), torch.tensor([0]))


def _case(adv: float):
    """One row, mask [0, 1, 1, 1], ratios [-, 1.5, 0.5, 1.0]."""
    behav = torch.tensor([[-9.0, -1.0, -1.0, -2.0]])
    logp = (behav + torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.0]])))
    logp[0, 0] = 123.0  # garbage at a masked position: must not matter
    logp.requires_grad_(True)
    return logp, behav, torch.tensor([adv]), torch.tensor([[0.0, 1.0, 1.0, 1.0]])


def test_clipped_loss_positive_advantage_hand_computed():
    logp, behav, adv, mask = _case(1.0)
    loss, st = policy_loss(logp, behav, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    # min(r A, clip(r) A): 1.5 -> 1.28 (clipped), 0.5 -> 0.5, 1.0 -> 1.0
    assert loss.item() == pytest.approx(-(1.28 + 0.5 + 1.0) / 3, abs=1e-6)
    assert (st.tokens, st.clipped, st.capped) == (3, 1, 0)
    assert st.ratio_sum == pytest.approx(3.0, abs=1e-6)
    loss.backward()
    # d/dlogp of -(r A)/3 is -r A / 3 where unclipped; 0 where clipped or masked
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, -0.5 / 3, -1 / 3]]), atol=1e-6)


def test_clipped_loss_negative_advantage_and_cap_hand_computed():
    logp, behav, adv, mask = _case(-2.0)
    loss, st = policy_loss(logp, behav, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    # 1.5 -> min(-3, -2.56) = -3, 0.5 -> min(-1, -1.6) = -1.6 (clipped), 1.0 -> -2
    assert loss.item() == pytest.approx((3 + 1.6 + 2) / 3, abs=1e-6)
    assert (st.clipped, st.capped) == (1, 0)
    capped, st = policy_loss(logp, behav, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28,
                             max_is_weight=1.4)
    # the stale token's ratio is truncated at 1.4: -3 -> -2.8, and it no longer has a gradient
    assert capped.item() == pytest.approx((2.8 + 1.6 + 2) / 3, abs=1e-6)
    assert (st.clipped, st.capped) == (1, 1)
    capped.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 2] == 0
    assert logp.grad[0, 3].item() == pytest.approx(2 / 3, abs=1e-6)


def test_cap_must_exceed_clip():
    logp, behav, adv, mask = _case(1.0)
    with pytest.raises(ValueError, match="max_is_weight"):
        policy_loss(logp, behav, adv, mask, clip_eps_high=0.28, max_is_weight=1.2)


def test_batch_wide_denominator():
    logp, behav, adv, mask = _case(1.0)
    loss, _ = policy_loss(logp, behav, adv, mask, clip_eps_high=0.28, denominator=6)
    assert loss.item() == pytest.approx(-(1.28 + 0.5 + 1.0) / 6, abs=1e-6)


def test_k3_kl_hand_computed_and_in_loss():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert k3_kl(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert k3_kl(logp, logp).item() == 0
    lp = torch.log(torch.tensor([[0.3, 0.5]]))
    loss, st = policy_loss(lp, lp, torch.tensor([0.0]), torch.tensor([[0.0, 1.0]]),
                           ref_logp=torch.log(torch.tensor([[0.9, 0.25]])), kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * (0.5 + math.log(2) - 1), abs=1e-6)
    assert st.kl_sum == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)


def test_token_logprobs_matches_log_softmax_and_restricted_vocab():
    torch.manual_seed(0)
    logits, ids = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    lp = token_logprobs(logits, ids)
    ref = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(lp[:, 1:], ref, atol=1e-6) and (lp[:, 0] == 0).all()
    allowed = torch.tensor([2, 5])
    ids = torch.tensor([[0, 2, 5, 5, 3]])  # 0 and 3 are not allowed (prompt tokens): logprob 0
    lp = token_logprobs(logits[:1], ids, allowed)
    sub = torch.log_softmax(logits[0, :, allowed], -1)
    assert lp[0, 1].item() == pytest.approx(sub[0, 0].item(), abs=1e-6)
    assert lp[0, 2].item() == pytest.approx(sub[1, 1].item(), abs=1e-6)
    assert lp[0, 4].item() == 0


def _loss_from_logits(logits, ids, behav, adv, mask, **kw):
    return policy_loss(token_logprobs(logits, ids), behav, adv, mask, **kw)[0]


@pytest.mark.parametrize("kw", [{}, {"max_is_weight": 2.0}, {"kl_coef": 0.5}])
def test_masked_tokens_contribute_nothing(kw):
    torch.manual_seed(1)
    B, T, V = 3, 6, 11
    ids = torch.randint(0, V, (B, T))
    mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=torch.float)
    behav = -torch.rand(B, T) * 3 * mask
    adv = torch.tensor([1.0, -0.5, 2.0])
    base = torch.randn(B, T, V)
    if kw.get("kl_coef"):
        kw = kw | {"ref_logp": -torch.rand(B, T)}
    # logits at position t score token t+1: those feeding a masked token (and the last) are "masked"
    feeds_masked = torch.cat([mask[:, 1:] == 0, torch.ones(B, 1, dtype=torch.bool)], dim=1)

    def run(logits, behav):
        logits = logits.clone().requires_grad_(True)
        loss = _loss_from_logits(logits, ids, behav, adv, mask, **kw)
        loss.backward()
        return loss.detach(), logits.grad

    loss_a, grad_a = run(base, behav)
    changed = base + feeds_masked[..., None] * torch.randn(B, T, V) * 1e4
    behav_changed = torch.where(mask.bool(), behav, torch.full_like(behav, -1e9))
    loss_b, grad_b = run(changed, behav_changed)
    assert torch.isfinite(loss_b) and torch.isfinite(grad_b).all()
    assert torch.equal(loss_a, loss_b)
    assert torch.allclose(grad_a, grad_b, atol=1e-7)
    assert (grad_b[feeds_masked] == 0).all()


def test_on_policy_gradient_equals_policy_gradient():
    torch.manual_seed(2)
    B, T, V = 4, 7, 9
    ids = torch.randint(0, V, (B, T))
    mask = (torch.rand(B, T) > 0.4).float()
    mask[:, 0] = 0
    adv = torch.randn(B)
    logits = torch.randn(B, T, V, requires_grad=True)
    logp = token_logprobs(logits, ids)
    clipped, _ = policy_loss(logp, logp.detach(), adv, mask, clip_eps_low=0.1, clip_eps_high=0.1)
    g_clip, = torch.autograd.grad(clipped, logits)
    logp = token_logprobs(logits, ids)
    pg = -(adv[:, None] * logp * mask).sum() / mask.sum()
    g_pg, = torch.autograd.grad(pg, logits)
    assert torch.allclose(g_clip, g_pg, atol=1e-6)
    assert clipped.item() == pytest.approx(-(adv[:, None] * mask).sum().item() / mask.sum().item(), abs=1e-5)


def test_micro_batches_sum_to_full_batch_gradient():
    torch.manual_seed(3)
    B, T, V = 4, 5, 6
    ids = torch.randint(0, V, (B, T))
    mask = torch.ones(B, T)
    mask[:, 0] = 0
    behav = -torch.rand(B, T)
    adv = torch.randn(B)
    logits = torch.randn(B, T, V, requires_grad=True)
    full = _loss_from_logits(logits, ids, behav, adv, mask)
    g_full, = torch.autograd.grad(full, logits)
    d = mask.sum().item()
    parts = sum(_loss_from_logits(logits[i:i + 2], ids[i:i + 2], behav[i:i + 2], adv[i:i + 2],
                                  mask[i:i + 2], denominator=d) for i in (0, 2))
    g_parts, = torch.autograd.grad(parts, logits)
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(g_full, g_parts, atol=1e-7)
