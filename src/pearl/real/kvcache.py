"""Per-session KV tensors for the real engine, and the `KVBlob` that carries them between engines.

One growable tensor per session, laid out [layer, k|v, kv_head, position, head_dim]: a layer's keys
for the first `n` positions are then a strided view with a contiguous last dimension, which is what
scaled-dot-product attention wants, and a decode step appends without touching other sessions.
On CPU this beats a paged pool: gathering pages back into one tensor every step would copy the whole
context, while growing by doubling copies each token O(1) times.

Which session holds how many tokens of KV is not decided here. In the engine the cache is bound to a
block table (`KVCache(..., table=blocks)`, a `pearl.kv.blocks.BlockManager`): the table frees and
truncates the cache's sessions itself (it calls `free` / `truncate` on every release and truncation),
and the cache refuses to write a position the table has not given the session. Unbound (tests, model
checks), the cache is plain per-session storage. Here we only store tensors and count their bytes.
No scheduling, no model code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pearl.errors import ConfigError
from pearl.kv.blocks import BlockManager

_GROW_ALIGN = 32  # positions; keeps reallocations rare for single-token appends


@dataclass(frozen=True)
class KVLayout:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * torch.tensor([], dtype=self.dtype).element_size()


@dataclass
class KVBlob:
    """A session's KV as one contiguous CPU tensor [layers, 2, kv_heads, num_tokens, head_dim], plus the
    token ids it was computed from (so the importer can check the prefix) and the policy version of the
    weights that computed it. Plain tensors and ints: picklable, so it crosses process and Ray boundaries."""

    data: torch.Tensor
    num_tokens: int
    token_ids: tuple[int, ...]
    version: int = 0

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def layout(self) -> KVLayout:
        L, _, h, _, d = self.data.shape
        return KVLayout(L, h, d, self.data.dtype)


@dataclass
class _Entry:
    buf: torch.Tensor  # [layers, 2, kv_heads, capacity, head_dim]
    length: int = 0
    token_ids: list[int] = field(default_factory=list)  # ids of the `length` positions, for prefix reuse

    @property
    def capacity(self) -> int:
        return self.buf.shape[3]


class KVCache:
    def __init__(self, layout: KVLayout, device: torch.device | str = "cpu", table: BlockManager | None = None):
        self.layout = layout
        self.device = torch.device(device)
        self._entries: dict[str, _Entry] = {}
        self.table = table  # the owner of which session holds how many tokens (None: unbound)
        self.mirror: Any = None  # the decoder's padded copy of this cache for batched decode steps
        if table is not None:
            table.attach(self)

    # ------------------------------------------------------------ session lifetime
    def has(self, session: str) -> bool:
        return session in self._entries

    def sessions(self) -> list[str]:
        return list(self._entries)

    def length(self, session: str) -> int:
        e = self._entries.get(session)
        return e.length if e else 0

    def token_ids(self, session: str) -> list[int]:
        e = self._entries.get(session)
        return list(e.token_ids) if e else []

    def free(self, session: str) -> None:
        self._entries.pop(session, None)

    def truncate(self, session: str, n: int) -> None:
        """Forget positions >= n (their memory stays reserved for the next append)."""
        e = self._entries.get(session)
        if e is not None and n < e.length:
            e.length = max(n, 0)
            del e.token_ids[e.length:]

    def reserve(self, session: str, n_total: int) -> None:
        """Make room for `n_total` positions, creating the session if needed; bound to a table, only
        within the tokens the table holds for the session."""
        self._within_table(session, n_total)
        self._ensure(session, n_total)

    def _within_table(self, session: str, n: int) -> None:
        if self.table is not None and n > self.table.held(session):
            raise RuntimeError(f"KV of session {session!r}: {n} positions written but the block table "
                               f"holds {self.table.held(session)} tokens for it")

    def _ensure(self, session: str, n_total: int) -> None:
        e = self._entries.get(session)
        if e is None:
            self._entries[session] = _Entry(self._alloc(_round_up(n_total)))
            return
        if n_total > e.capacity:
            new = self._alloc(_round_up(max(n_total, 2 * e.capacity)))
            new[:, :, :, : e.length] = e.buf[:, :, :, : e.length]
            e.buf = new

    def _alloc(self, capacity: int) -> torch.Tensor:
        lay = self.layout
        return torch.empty(lay.layers, 2, lay.kv_heads, capacity, lay.head_dim, dtype=lay.dtype, device=self.device)

    # ------------------------------------------------------------ used by the forward pass
    def buffer(self, session: str) -> torch.Tensor:
        return self._entries[session].buf

    def commit(self, session: str, start: int, token_ids: list[int]) -> None:
        """Record that positions [start, start + len(token_ids)) now hold valid KV."""
        e = self._entries[session]
        if start != e.length:
            raise RuntimeError(f"KV of session {session!r} written at {start} but holds {e.length} positions")
        e.length = start + len(token_ids)
        e.token_ids.extend(token_ids)

    # ------------------------------------------------------------ hand-off and migration
    def export(self, session: str, version: int = 0) -> KVBlob:
        e = self._entries.get(session)
        if e is None:
            raise KeyError(f"no KV for session {session!r}")
        data = e.buf[:, :, :, : e.length].to("cpu", copy=True).contiguous()
        return KVBlob(data, e.length, tuple(e.token_ids), version)

    def import_(self, session: str, blob: KVBlob) -> None:
        """Replace the session's KV with the blob's (any old KV of that session is dropped)."""
        got, want = blob.layout(), self.layout
        if (got.layers, got.kv_heads, got.head_dim) != (want.layers, want.kv_heads, want.head_dim):
            raise ConfigError(f"KV blob has {got.layers} layers × {got.kv_heads} kv heads × {got.head_dim} dims "
                              f"but this engine's model has {want.layers} × {want.kv_heads} × {want.head_dim}")
        if len(blob.token_ids) != blob.num_tokens or blob.data.shape[3] != blob.num_tokens:
            raise ConfigError(f"KV blob holds {blob.num_tokens} positions but {len(blob.token_ids)} token ids")
        self._within_table(session, blob.num_tokens)
        self.free(session)
        self._ensure(session, blob.num_tokens + 1)
        e = self._entries[session]
        e.buf[:, :, :, : blob.num_tokens] = blob.data.to(self.device, want.dtype)
        e.length = blob.num_tokens
        e.token_ids = list(blob.token_ids)

    # ------------------------------------------------------------ accounting
    def tokens_used(self) -> int:
        return sum(e.length for e in self._entries.values())

    def bytes_used(self) -> int:
        return self.tokens_used() * self.layout.bytes_per_token

    def bytes_reserved(self) -> int:
        return sum(e.capacity for e in self._entries.values()) * self.layout.bytes_per_token

    def check(self) -> None:
        """Bound to a table: every stored session is in it, within its tokens, and exactly its tokens
        when the table holds the session idle (retained KV is all valid)."""
        if self.table is None:
            return
        held, idle = self.table.tokens, self.table.idle
        for s in self._entries.keys() | idle.keys():
            n = self.length(s)
            if s not in held or n > held[s] or (s in idle and n != held[s]):
                raise AssertionError(f"KV of session {s!r} holds {n} positions, the block table "
                                     f"{held.get(s)} tokens ({'idle' if s in idle else 'active'})")


def _round_up(n: int) -> int:
    return max(_GROW_ALIGN, -(-n // _GROW_ALIGN) * _GROW_ALIGN)
