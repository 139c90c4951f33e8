r"""The GRPO loss for asynchronous, off-policy-corrected training. Pure torch functions, no state.

The exact variant
-----------------
Sample i of group g has the episode return R_i. Its advantage, shared by all of its tokens, is

    A_i = (R_i - mean_g R) / (std_g R + eps)     (normalize_std=True; std with Bessel's correction,
    A_i =  R_i - mean_g R                          normalize_std=False;   a group of one has A = 0)

For every model token t (loss mask m_t = 1) with trainer log-prob  logp_t  and behaviour log-prob
b_t  (the engine's, recorded at sampling time, possibly several policy versions old):

    r_t = exp(logp_t - b_t)                                       importance ratio vs the behaviour
    s_t = min( r_t A,  clip(r_t, 1 - eps_low, 1 + eps_high) A )   PPO clip, asymmetric ("clip-higher")
    if max_is_weight C is set:  s_t = max(s_t, C A)  where A < 0  (dual clip: the ratio of a very
                                                                   stale token is truncated at C)
    kl_t = exp(q_t - logp_t) - (q_t - logp_t) - 1                 k3 estimator of KL(pi || ref),
                                                                   q_t the reference log-prob
    L = sum_{i,t} m_{i,t} (-s_{i,t} + beta kl_{i,t}) / D          D = sum m over the whole batch

So the loss is a token mean over the whole batch (every model token weighs the same, long responses
are not down-weighted as in a per-sequence mean), and micro-batches pass the batch-wide D so that
their gradients add up to exactly the full-batch gradient. Why the behaviour policy and not a
separate "old" policy: in async RL the behaviour log-probs are what we have for free (the engine
returns them); the clip then bounds how far one update can move off them, and the cap bounds the
only unbounded case of the clipped objective (A < 0 with r_t -> inf), which is where stale tokens
would otherwise blow up the gradient. When r_t = 1 (on-policy) the gradient of s_t is A grad logp_t,
the plain policy gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, group_ids: Tensor, normalize_std: bool = True,
                     eps: float = 1e-6) -> Tensor:
    """Per-sample advantages: the reward minus its group's mean, optionally over the group's std.

    `rewards` and `group_ids` are 1-D of the same length; group ids need not be contiguous or sorted.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    group_ids = torch.as_tensor(group_ids)
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} "
                         f"must be 1-D and of the same length")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards must be finite")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(rewards))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, rewards) / count
    centred = rewards - mean[inverse]
    if not normalize_std:
        return centred.float()
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, centred ** 2)
    # Bessel's correction; a group of one has no spread (and a centred reward of exactly 0).
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return (centred / (std[inverse] + eps)).float()


def token_logprobs(logits: Tensor, token_ids: Tensor, allowed_ids: Tensor | None = None) -> Tensor:
    """log p(token_t | tokens_<t) for every position; position 0 (no context) gets 0.

    `logits` is [B, T, V] (the model's output for `token_ids` [B, T]). With `allowed_ids`, the
    softmax runs over those vocabulary entries only, matching an engine that sampled from an
    action-restricted vocabulary (otherwise the ratio would compare two different distributions).
    """
    if logits.ndim != 3 or logits.shape[:2] != token_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match token_ids {tuple(token_ids.shape)}")
    logits = logits[:, :-1].float()
    target = token_ids[:, 1:]
    if allowed_ids is not None:
        masked = torch.full_like(logits, float("-inf"))
        masked[..., allowed_ids] = logits[..., allowed_ids]
        logits = masked
    picked = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    # A disallowed target (a prompt token under `allowed_ids`) is -inf; it is masked anyway, but a
    # -inf would turn into NaN gradients, so replace it.
    lp = torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp))
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(d) - d - 1 with d = ref - logp; >= 0, unbiased."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


@dataclass(frozen=True)
class LossStats:
    """Sums over the masked tokens of one call (add them across micro-batches, then divide)."""

    tokens: int
    ratio_sum: float
    clipped: int  # tokens where the PPO clip took over (zero gradient)
    capped: int  # tokens where the dual-clip cap took over
    kl_sum: float


def policy_loss(logp: Tensor, behav_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                clip_eps_low: float = 0.2, clip_eps_high: float = 0.2,
                max_is_weight: float | None = None, ref_logp: Tensor | None = None,
                kl_coef: float = 0.0, denominator: float | None = None) -> tuple[Tensor, LossStats]:
    """The loss in the module docstring. All tensors are [B, T] except `advantages` ([B] or [B, T]).

    `denominator` is D, the number of model tokens in the *whole* batch; default: this call's.
    """
    if advantages.ndim == 1:
        advantages = advantages[:, None].expand_as(logp)
    if not (logp.shape == behav_logp.shape == advantages.shape == mask.shape):
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, behav {tuple(behav_logp.shape)}, "
                         f"adv {tuple(advantages.shape)}, mask {tuple(mask.shape)}")
    if max_is_weight is not None and max_is_weight <= 1 + clip_eps_high:
        raise ValueError(f"max_is_weight ({max_is_weight}) must exceed 1 + clip_eps_high")
    m = mask.to(logp.dtype)
    on = mask.bool()
    # Masked positions may hold anything (padding, prompt); zero them before exp so that a huge
    # difference there cannot become inf * 0 = NaN.
    delta = torch.where(on, logp - behav_logp.to(logp.dtype), torch.zeros_like(logp))
    ratio = torch.exp(delta)
    adv = advantages.to(logp.dtype)
    unclipped = ratio * adv
    clipped_ratio = torch.clamp(ratio, 1 - clip_eps_low, 1 + clip_eps_high)
    surrogate = torch.minimum(unclipped, clipped_ratio * adv)
    clip_active = on & (clipped_ratio * adv < unclipped)
    cap_active = torch.zeros_like(on)
    if max_is_weight is not None:
        floor = max_is_weight * adv
        cap_active = on & (adv < 0) & (surrogate < floor)
        surrogate = torch.where(cap_active, floor, surrogate)
    per_token = -surrogate
    kl_sum = 0.0
    if ref_logp is not None and kl_coef:
        kl = k3_kl(logp, torch.where(on, ref_logp.to(logp.dtype), logp.detach()))
        per_token = per_token + kl_coef * kl
        kl_sum = float((kl.detach() * m).sum())
    n = int(m.sum())
    d = float(denominator) if denominator is not None else max(n, 1)
    if d <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    loss = (per_token * m).sum() / d
    stats = LossStats(tokens=n, ratio_sum=float((ratio.detach() * m).sum()),
                      clipped=int((clip_active & ~cap_active).sum()), capped=int(cap_active.sum()),
                      kl_sum=kl_sum)
    return loss, stats
