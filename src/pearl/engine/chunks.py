"""The attention a prefill chunk costs (token pairs), for the emulated engine's step time.

A step's prefill tokens go to the admitted prompts in FIFO order, each token attending to its
prompt's prefix so far. A prompt longer than a step's budget is prefilled over several steps, and its
prefix grows by a chunk every step, so its later chunks cost more attention than its first. The
engine plans such steps as one segment at one step time: `prefill_attn` is their mean.

What it must not do: touch the engine's state (it reads the admitted requests only).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice

from pearl.engine.request import Request

__all__ = ["prefill_attn"]


def prefill_attn(pre: Sequence[Request], chunk: int, k: int) -> float:
    """The mean token pairs of a step's `chunk` prefill tokens over a segment of `k` steps. A segment
    of k > 1 steps has a head prompt longer than the chunk: it fills the chunk every step, its prefix
    growing by a chunk each time, and the prompts admitted behind it (if any) take the rest of the
    step it ends in."""
    head = pre[0] if pre else None
    if head is None or k <= 1 or head.pending <= chunk:
        return _fifo(pre, chunk)
    c0, f = head.num_computed, min(k, head.pending // chunk)  # f: the steps the head fills
    total = chunk * (f * (c0 + chunk / 2) + chunk * f * (f - 1) / 2)
    if f < k:  # (then f = k - 1) the step it ends in: the rest of it, then the next prompts'
        rest = head.pending - f * chunk
        total += rest * (c0 + f * chunk + rest / 2) + _fifo(islice(pre, 1, None), chunk - rest)
    return total / k


def _fifo(reqs: Iterable[Request], left: int) -> float:
    """Token pairs of one step's `left` prefill tokens, given to `reqs` in order."""
    attn = 0.0
    for r in reqs:
        if left <= 0:
            break
        n = min(r.pending, left)
        attn += n * (r.num_computed + n / 2)
        left -= n
    return attn
