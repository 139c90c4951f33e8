"""The padded KV mirror of a batched decode step (`pearl.real.modeling.Decoder.forward`).

Single-token decodes of several sequences attend in one batched call over a padded copy of their
sessions' KV. The copy is kept across steps and refilled only where it went stale. It belongs to one
KV cache (`KVCache.mirror`): engines that share a decoder's weights and step at once on threads each
use their own. `chunks` are `pearl.real.modeling.SeqChunk`s.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from pearl.real.kvcache import KVCache


class PaddedStep:
    """One step's batched-decode operands: per layer, the padded K/V mirror with this step's new KV
    written in, and the padding mask (None when every sequence has the same length)."""

    def __init__(self, buf: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, max_len: int,
                 mask: torch.Tensor | None):
        self.buf, self.slots, self.starts, self.max_len, self.mask = buf, slots, starts, max_len, mask

    def layer(self, li: int, new_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """new_kv [2, kv_heads, B, head_dim] goes to each slot's position `start`; returns K, V views."""
        B = new_kv.shape[2]
        lay = self.buf[li]  # [2, slots, kv_heads, capacity, head_dim]
        lay[:, self.slots, :, self.starts] = new_kv.permute(2, 0, 1, 3)  # indexed dims go first: [B, 2, h, d]
        return lay[0, :B, :, : self.max_len], lay[1, :B, :, : self.max_len]


class PaddedKV:
    """A padded mirror [layers, 2, slots, kv_heads, capacity, head_dim] of the KV of the sequences in a
    batched decode step, kept across steps: slot b is refilled from the session's cache only when it
    did not hold exactly that session's first `start` positions at the end of the previous step (same
    KV cache, same session buffer object). Every step forgets what its own decode slots did not
    write, so KV changed any other way (truncation, a prefill chunk, an import) is always re-read.
    Positions past a slot's length hold zeros or earlier finite KV and are masked out."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.held: list[tuple[str, weakref.ref[torch.Tensor], int] | None] = []  # per slot: (session, source buffer, length)
        self._next: list[tuple[str, weakref.ref[torch.Tensor], int] | None] = []

    def prepare(self, kv: KVCache, chunks: list[Any]) -> PaddedStep:
        B = len(chunks)
        lens = [c.start + 1 for c in chunks]
        max_len = max(lens)
        srcs = [kv.buffer(c.session) for c in chunks]
        ref = srcs[0]
        buf = self.buf
        if (buf is None or buf.shape[2] < B or buf.shape[4] < max_len or buf.dtype != ref.dtype
                or buf.device != ref.device or buf.shape[0] != ref.shape[0] or buf.shape[3] != ref.shape[2]):
            cap = max(max_len, buf.shape[4] if buf is not None else 0)
            slots = max(B, buf.shape[2] if buf is not None else 0)
            new = torch.zeros(ref.shape[0], 2, slots, ref.shape[2], -(-cap // 128) * 128, ref.shape[4],
                              dtype=ref.dtype, device=ref.device)
            if buf is not None and buf.shape[0] == new.shape[0] and buf.shape[3] == new.shape[3] \
                    and buf.dtype == new.dtype and buf.device == new.device:
                new[:, :, : buf.shape[2], :, : buf.shape[4]] = buf
            else:
                self.held = []
            self.buf = buf = new
        self.held += [None] * (buf.shape[2] - len(self.held))
        dst, src = [], []
        for b, (c, sb) in enumerate(zip(chunks, srcs)):
            h = self.held[b]
            if not (h is not None and h[0] == c.session and h[1]() is sb and h[2] == c.start) and c.start > 0:
                dst.append(buf[:, :, b, :, : c.start])
                src.append(sb[:, :, :, : c.start])
        if dst:
            copy_all(dst, tuple(src))
        self._next = [(c.session, weakref.ref(sb), c.start + 1) for c, sb in zip(chunks, srcs)]
        self.held = [None] * buf.shape[2]  # until done(): a failed step leaves nothing trusted
        dev = buf.device
        mask = None
        if min(lens) != max_len:
            ln = torch.tensor(lens, device=dev)
            mask = (torch.arange(max_len, device=dev)[None, :] < ln[:, None])[:, None, None, :]
        return PaddedStep(buf, torch.arange(B, device=dev), torch.tensor([c.start for c in chunks], device=dev),
                           max_len, mask)

    def done(self, kv: KVCache, chunks: list[Any]) -> None:
        """Write the step's new KV (every layer, one copy per sequence) back to the sessions' caches."""
        buf = self.buf
        assert buf is not None
        copy_all([kv.buffer(c.session)[:, :, :, c.start] for c in chunks],
                  tuple(buf[:, :, b, :, c.start] for b, c in enumerate(chunks)))
        self.held = self._next + [None] * (self.buf.shape[2] - len(self._next))  # type: ignore[union-attr]


def copy_all(dst: list[torch.Tensor], src: tuple[torch.Tensor, ...]) -> None:
    """dst[i] <- src[i] for all i; one fused call where torch has it."""
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(dst, list(src))
    else:
        for a, b in zip(dst, src):
            a.copy_(b)
