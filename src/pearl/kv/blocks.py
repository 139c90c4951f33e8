"""KV-cache block bookkeeping per session, with no torch.

A *session* is a trajectory: its KV stays on an engine between turns (prefix reuse), so blocks are
owned by sessions, not by requests. A session is `active` while one of its requests is scheduled and
`idle` while its trajectory waits on the environment; idle sessions are evicted least-recently-used
first when blocks run out.

This table is the one owner of the fact "which session holds how many tokens of KV". Storage that
holds the KV itself (the real engine's `KVCache`) is `attach`ed and only follows: every release
(finish without retention, abort, preemption, eviction, drop) frees the session's storage and every
truncation (prefix reuse, abort keeping KV) truncates it, from here and nowhere else.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class KVStorage(Protocol):
    """What an attached store must do when the table releases or truncates a session."""

    def free(self, session: str) -> None: ...

    def truncate(self, session: str, n: int) -> None: ...


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1 (got {num_blocks}, {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks = num_blocks
        self.tokens: dict[str, int] = {}  # session -> tokens whose KV is held
        self.idle: OrderedDict[str, None] = OrderedDict()  # evictable sessions, LRU first
        self.idle_blocks = 0  # Σ blocks of idle sessions (kept as a running sum: asked every step)
        self.storage: KVStorage | None = None

    def attach(self, storage: KVStorage) -> None:
        """Make `storage` follow this table: freed on every release, truncated on every truncation."""
        self.storage = storage

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def held(self, session: str) -> int:
        return self.tokens.get(session, 0)

    def extra_blocks(self, session: str, total_tokens: int) -> int:
        """Blocks still to allocate for the session to hold `total_tokens` tokens."""
        return max(0, self.blocks_for(total_tokens) - self.blocks_for(self.tokens.get(session, 0)))

    def evictable_blocks(self) -> int:
        return self.idle_blocks

    def can_grow(self, session: str, total_tokens: int, evict: bool = True) -> bool:
        need = self.extra_blocks(session, total_tokens)
        if need <= self.free_blocks:
            return True
        own = self.blocks_for(self.tokens.get(session, 0)) if session in self.idle else 0
        return evict and need <= self.free_blocks + self.idle_blocks - own

    def grow(self, session: str, total_tokens: int) -> list[str]:
        """Hold `total_tokens` for the session, evicting idle sessions if needed; returns the evicted.

        Raises MemoryError if even eviction cannot make room (callers check `can_grow` first).
        """
        need = self.extra_blocks(session, total_tokens)
        evicted: list[str] = []
        self.set_active(session)  # never evict the session we are growing
        while need > self.free_blocks and self.idle:
            victim = next(iter(self.idle))
            evicted.append(victim)
            self.release(victim)
        if need > self.free_blocks:
            raise MemoryError(f"KV cache full: session {session} needs {need} blocks, {self.free_blocks} free")
        self.free_blocks -= need
        if total_tokens > self.tokens.get(session, 0) or session not in self.tokens:
            self.tokens[session] = max(total_tokens, self.tokens.get(session, 0))
        return evicted

    def truncate(self, session: str, total_tokens: int) -> None:
        """Keep only the first `total_tokens` tokens of the session (e.g. a prefix that was reused)."""
        old = self.tokens.get(session, 0)
        if total_tokens >= old:
            return
        freed = self.blocks_for(old) - self.blocks_for(total_tokens)
        self.free_blocks += freed
        if session in self.idle:
            self.idle_blocks -= freed
        self.tokens[session] = total_tokens
        if self.storage is not None:
            self.storage.truncate(session, total_tokens)

    def set_idle(self, session: str) -> None:
        if session in self.tokens:
            if session not in self.idle:
                self.idle_blocks += self.blocks_for(self.tokens[session])
            self.idle[session] = None
            self.idle.move_to_end(session)

    def set_active(self, session: str) -> None:
        if session in self.idle:
            del self.idle[session]
            self.idle_blocks -= self.blocks_for(self.tokens[session])

    def release(self, session: str) -> int:
        """Free all of a session's blocks; returns how many tokens it held."""
        self.set_active(session)
        held = self.tokens.pop(session, 0)
        self.free_blocks += self.blocks_for(held)
        if self.storage is not None:
            self.storage.free(session)
        return held

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def check(self) -> None:
        total = sum(self.blocks_for(t) for t in self.tokens.values())
        if total != self.used_blocks:
            raise AssertionError(f"block accounting broken: sessions hold {total}, used {self.used_blocks}")
        idle = sum(self.blocks_for(self.tokens[s]) for s in self.idle)
        if idle != self.idle_blocks:
            raise AssertionError(f"idle block count broken: {idle} != {self.idle_blocks}")
