"""`GRPOTrainer`: one optimizer update per rollout batch of `Trajectory`s, and versioned weights.

The trainer owns the model, the optimizer and the policy version. `step(trajectories)`:

1. drops failed trajectories (the run goes on without them) and computes group-normalised
   advantages over the rest (`pearl.rl.grpo.group_advantages`);
2. packs them into right-padded micro-batches; with right padding and a causal model, padding can
   only follow a sequence, so no attention mask or position offsets are needed and any module that
   maps token ids [B, T] to logits [B, T, V] (or an HF output with `.logits`) works;
3. recomputes the log-probs with one forward pass per micro-batch, applies the token-mean clipped
   loss against the behaviour log-probs with the batch-wide token count as denominator (so the
   summed micro-batch gradients equal the full-batch gradient), clips the gradient norm, steps AdamW;
4. increments `version` and returns metrics.

It does not decide staleness (admission control does), push weights (the runtime does, from
`state_dict_snapshot()`), or measure time (the runtime does).
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import math
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from pearl.config import Frozen, parse_config
from pearl.rl.grpo import group_advantages, policy_loss, token_logprobs
from pearl.rl.trajectory import Status, Trajectory


class TrainerConfig(Frozen):
    lr: float = Field(default=1e-6, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)  # AdamW's epsilon
    weight_decay: float = Field(default=0.0, ge=0)
    clip_eps_low: float = Field(default=0.2, ge=0, lt=1)
    clip_eps_high: float = Field(default=0.28, ge=0)  # DAPO's clip-higher keeps exploration alive
    max_is_weight: float | None = Field(default=None, gt=1)  # dual-clip cap for stale tokens
    kl_coef: float = Field(default=0.0, ge=0)  # > 0 keeps a frozen copy of the initial model
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=8, ge=1)  # sequences per forward/backward pass
    normalize_std: bool = True
    adv_eps: float = Field(default=1e-6, gt=0)
    pad_token_id: int = Field(default=0, ge=0)
    # bfloat16: the forward and backward matmuls run under CPU/CUDA autocast in bf16, while the
    # weights, gradients and AdamW state stay float32 (bf16 weights would round away lr-1e-5 updates)
    # and the output projection and log-softmax of the scored tokens run in float32.
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Micro-batch by GRPO group and run each group's common prompt through the model once (HF causal
    # LMs; other modules score every row in full). Same loss and gradient, far fewer tokens.
    share_prompt: bool = True

    @model_validator(mode="after")
    def _check(self) -> "TrainerConfig":
        for b in self.betas:
            if not 0 <= b < 1:
                raise ValueError(f"betas must be in [0, 1), got {self.betas}")
        if self.max_is_weight is not None and self.max_is_weight <= 1 + self.clip_eps_high:
            raise ValueError(f"max_is_weight ({self.max_is_weight}) must exceed 1 + clip_eps_high "
                             f"({1 + self.clip_eps_high})")
        return self

    @classmethod
    def parse(cls, data: dict[str, Any] | None, what: str = "trainer") -> "TrainerConfig":
        """Validate user input; a bad field becomes a one-line `ConfigError` naming it."""
        return parse_config(data, cls, what)


@dataclass
class Batch:
    """Right-padded tensors for a list of trajectories (one row each)."""

    input_ids: Tensor  # [B, T] long
    loss_mask: Tensor  # [B, T] float, 0 on padding
    behav_logprobs: Tensor  # [B, T] float
    versions: Tensor  # [B, T] long, -1 on masked tokens and padding
    advantages: Tensor  # [B] float
    lengths: Tensor  # [B] long


def build_batch(trajectories: Sequence[Trajectory], advantages: Tensor, pad_token_id: int = 0) -> Batch:
    if not trajectories:
        raise ValueError("build_batch needs at least one trajectory")
    lengths = [len(t) for t in trajectories]
    b, width = len(trajectories), max(lengths)
    ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.float32)
    behav = torch.zeros((b, width), dtype=torch.float32)
    versions = torch.full((b, width), -1, dtype=torch.long)
    for i, t in enumerate(trajectories):
        n = lengths[i]
        ids[i, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        behav[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
        versions[i, :n] = torch.tensor(t.versions, dtype=torch.long)
    return Batch(ids, mask, behav, versions, advantages.float(), torch.tensor(lengths))


def _split_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder body, output projection) of an HF causal LM (`.model` + `.lm_head`), else None."""
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if isinstance(body, nn.Module) and isinstance(head, nn.Linear) and hasattr(getattr(model, "config", None),
                                                                                  "use_cache"):
        return body, head
    return None


def _hidden(body: nn.Module, ids: Tensor, shared_prefix: int) -> Tensor:
    """The body's last hidden states [B, T, H]; with `shared_prefix` P > 1 (all rows start with the same
    P tokens, and there is more after them), the prefix runs once at batch 1 and the rows continue from
    its KV cache, repeated per row (differentiable: each row's gradient flows back into the prefix)."""
    p = shared_prefix
    if p < 2 or p >= ids.shape[1]:
        return body(input_ids=ids, use_cache=False).last_hidden_state
    pre = body(input_ids=ids[:1, :p], use_cache=True)
    cache = getattr(pre, "cache", None) or pre.past_key_values  # transformers 5.2x renamed it `cache`
    cache.batch_repeat_interleave(ids.shape[0])
    kw = "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"
    rest = body(input_ids=ids[:, p:], use_cache=True, **{kw: cache}).last_hidden_state
    return torch.cat([pre.last_hidden_state.expand(ids.shape[0], -1, -1), rest], dim=1)


def shared_prefix_len(trajectories: Sequence[Trajectory]) -> int:
    """How many leading tokens every trajectory has in common before its first model token."""
    first = [t.loss_mask.index(1) if 1 in t.loss_mask else len(t.loss_mask) for t in trajectories]
    n, ref = min(first), trajectories[0].token_ids
    for t in trajectories[1:]:
        ids = t.token_ids
        k = 0
        while k < n and ids[k] == ref[k]:
            k += 1
        n = k
    return n


def forward_logits(model: nn.Module, input_ids: Tensor) -> Tensor:
    """Logits [B, T, V] from an HF causal LM or from a module returning logits directly."""
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "use_cache"):
        out = model(input_ids=input_ids, use_cache=False)  # an HF model: no KV cache for training
    else:
        out = model(input_ids)
    return out.logits if hasattr(out, "logits") else out


class GRPOTrainer:
    def __init__(self, model: nn.Module, config: TrainerConfig | None = None, *,
                 ref_model: nn.Module | None = None, allowed_token_ids: Sequence[int] | None = None,
                 version: int = 0):
        """`allowed_token_ids`: score model tokens over this sub-vocabulary only (an engine that
        samples from a fixed action set must report log-probs over the same set)."""
        self.model = model
        self.config = config or TrainerConfig()
        self.version = version
        c = self.config
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.device = self.params[0].device
        self.optimizer = torch.optim.AdamW(self.params, lr=c.lr, betas=c.betas, eps=c.eps,
                                           weight_decay=c.weight_decay)
        self.ref_model = None
        if c.kl_coef > 0:
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.allowed = None
        if allowed_token_ids is not None:
            self.allowed = torch.tensor(sorted(set(int(i) for i in allowed_token_ids)),
                                        dtype=torch.long, device=self.device)

    # ------------------------------------------------------------ scoring
    def autocast(self) -> Any:
        """The precision context of the forward pass (a no-op in float32)."""
        if self.config.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def logprobs(self, input_ids: Tensor, model: nn.Module | None = None, mask: Tensor | None = None,
                 shared_prefix: int = 0) -> Tensor:
        """log p(token_t | tokens_<t) [B, T] (0 at position 0). With `mask` [B, T], only the masked
        positions are scored (the rest are 0): for an HF causal LM the output projection and the
        log-softmax then run over those rows only, not over the prompt's and the padding's.
        `shared_prefix` P > 1: every row starts with the same P tokens (a GRPO group's prompt), which
        then go through the model once, their KV shared by the rows (the same values and gradients)."""
        model = model or self.model
        ids = input_ids.to(self.device)
        split = _split_head(model) if mask is not None else None
        with self.autocast():
            if split is None:
                return token_logprobs(forward_logits(model, ids), ids, self.allowed)
            hidden = _hidden(split[0], ids, shared_prefix)  # [B, T, H]
        return self._score(hidden, split[1], ids, mask.to(self.device))

    def _score(self, hidden: Tensor, head: nn.Linear, ids: Tensor, mask: Tensor) -> Tensor:
        """The masked positions' log-probs from the body's hidden states, through the head in float32."""
        on = mask.bool()
        on[:, 0] = False  # position 0 has no context
        b, t = on.nonzero(as_tuple=True)
        rows = hidden[b, t - 1].float()  # the hidden state that predicts token t
        w, bias = head.weight, head.bias
        if self.allowed is not None:
            w = w[self.allowed]
            bias = bias[self.allowed] if bias is not None else None
        logits = torch.nn.functional.linear(rows, w.float(), None if bias is None else bias.float())
        target = ids[b, t]
        if self.allowed is not None:  # the target's column in the allowed sub-vocabulary (-1: not allowed)
            col = torch.full((int(head.weight.shape[0]),), -1, dtype=torch.long, device=self.device)
            col[self.allowed] = torch.arange(len(self.allowed), device=self.device)
            target = col[target]
        ok = target >= 0
        picked = logits.gather(-1, target.clamp(min=0)[:, None])[:, 0]
        lp = torch.where(ok, picked - torch.logsumexp(logits, dim=-1), torch.zeros_like(picked))
        out = torch.zeros(ids.shape, dtype=lp.dtype, device=self.device)
        return out.index_put((b, t), lp)

    # ------------------------------------------------------------ one update
    def step(self, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
        c = self.config
        good = self._usable(trajectories)
        rewards = torch.tensor([t.reward for t in good], dtype=torch.float64)
        adv = group_advantages(rewards, torch.tensor([t.group_id for t in good]),
                               normalize_std=c.normalize_std, eps=c.adv_eps)
        total_tokens = sum(t.num_model_tokens for t in good)
        # A zero-advantage sample contributes nothing but its tokens to the denominator when there
        # is no KL term, so skip its forward/backward (DAPO's groups where every sample agreed).
        work = [i for i in range(len(good)) if c.kl_coef > 0 or adv[i] != 0]
        stale = [self.version - v for t in good for v, m in zip(t.versions, t.loss_mask) if m]

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = self._accumulate(good, adv, work, total_tokens)
        scored = sums["scored"]
        grad_norm, skipped = self._apply_update()
        return {
            "version": self.version,
            "loss": sums["loss"],
            "grad_norm": grad_norm,
            "skipped": skipped,
            "clip_fraction": sums["clipped"] / max(scored, 1),
            "capped_fraction": sums["capped"] / max(scored, 1),
            "ratio_mean": sums["ratio"] / scored if scored else 1.0,
            "kl": sums["kl"] / max(scored, 1),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "adv_abs_mean": float(adv.abs().mean()),
            "tokens": total_tokens,
            "tokens_scored": scored,
            "trajectories": len(good),
            "failed": len(trajectories) - len(good),
            "staleness_mean": sum(stale) / len(stale) if stale else 0.0,
            "staleness_max": max(stale) if stale else 0,
        }

    @staticmethod
    def _usable(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """The trajectories that did not fail; raises if any is still running or none is usable."""
        running = [t.id for t in trajectories if t.status is Status.RUNNING]
        if running:
            raise ValueError(f"trajectories still running (call finish() or fail()): {running[:5]}")
        good = [t for t in trajectories if t.ok]
        if not good:
            raise ValueError(f"no usable trajectories in a batch of {len(trajectories)} (all failed)")
        return good

    def _accumulate(self, good: Sequence[Trajectory], adv: Tensor, work: list[int],
                    total_tokens: int) -> dict[str, Any]:
        """Forward/backward of `good[i]` for i in `work`, in micro-batches, summing the gradients; the
        summed loss and loss statistics (tokens scored, ratio sum, clipped, capped, KL sum)."""
        c = self.config
        loss_sum = ratio_sum = kl_sum = 0.0
        scored = clipped = capped = 0
        for idx in self._micro_batches(good, work):
            batch = build_batch([good[i] for i in idx], adv[idx], c.pad_token_id)
            mask = batch.loss_mask.to(self.device)
            pre = shared_prefix_len([good[i] for i in idx]) if c.share_prompt and len(idx) > 1 else 0
            logp = self.logprobs(batch.input_ids, mask=mask, shared_prefix=pre)
            ref = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref = self.logprobs(batch.input_ids, self.ref_model, mask=mask, shared_prefix=pre)
            loss, st = policy_loss(logp, batch.behav_logprobs.to(self.device),
                                   batch.advantages.to(self.device), mask,
                                   clip_eps_low=c.clip_eps_low, clip_eps_high=c.clip_eps_high,
                                   max_is_weight=c.max_is_weight, ref_logp=ref, kl_coef=c.kl_coef,
                                   denominator=total_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
            scored += st.tokens
            ratio_sum += st.ratio_sum
            clipped += st.clipped
            capped += st.capped
            kl_sum += st.kl_sum
        return dict(loss=loss_sum, scored=scored, ratio=ratio_sum, clipped=clipped, capped=capped, kl=kl_sum)

    def _micro_batches(self, good: Sequence[Trajectory], work: list[int]) -> list[list[int]]:
        """`work` in chunks of at most micro_batch_size; with share_prompt, one GRPO group per chunk
        (its rows then share their prompt's forward pass)."""
        size = self.config.micro_batch_size
        if not self.config.share_prompt:
            return [work[i:i + size] for i in range(0, len(work), size)]
        groups: dict[int, list[int]] = {}
        for i in work:
            groups.setdefault(good[i].group_id, []).append(i)
        return [g[i:i + size] for g in groups.values() for i in range(0, len(g), size)]

    def _apply_update(self) -> tuple[float, bool]:
        """Clip and apply the accumulated gradients, bumping `version`; a non-finite gradient norm
        drops the update instead. Returns (gradient norm before clipping, skipped)."""
        c = self.config
        grad_norm = self._grad_norm()
        skipped = not math.isfinite(grad_norm)
        if skipped:  # a NaN/inf gradient would poison the weights: drop this update, keep the version
            self.optimizer.zero_grad(set_to_none=True)
        else:
            if c.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.params, c.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.version += 1
        return grad_norm, skipped

    def _grad_norm(self) -> float:
        grads = [p.grad.detach().float().norm() for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack(grads)))

    # ------------------------------------------------------------ weights for the engines
    def state_dict_snapshot(self) -> dict[str, Tensor]:
        """A detached CPU copy of the weights (safe to hand to engines while training goes on)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
