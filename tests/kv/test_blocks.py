"""BlockManager: per-session block accounting, LRU eviction of idle sessions, truncation.

Every test calls `check()` after each operation: it recomputes the used and idle block counts from the
per-session token counts and fails when the running sums kept by the operations disagree.
"""
from __future__ import annotations

import random

import pytest

from pearl.kv.blocks import BlockManager


def test_grow_truncate_release_keep_the_accounting():
    b = BlockManager(10, 16)
    b.grow("a", 20)  # 2 blocks
    b.check()
    b.grow("a", 33)  # 3 blocks
    b.check()
    assert b.held("a") == 33 and b.used_blocks == 3
    b.truncate("a", 16)  # back to 1 block
    b.check()
    assert b.held("a") == 16 and b.used_blocks == 1
    b.truncate("a", 40)  # never grows
    b.check()
    assert b.held("a") == 16
    assert b.release("a") == 16
    b.check()
    assert b.used_blocks == 0 and b.held("a") == 0


def test_idle_sessions_are_counted_and_evicted_lru_first():
    b = BlockManager(6, 16)
    for s in ("a", "b", "c"):
        b.grow(s, 32)  # 2 blocks each: the cache is full
        b.set_idle(s)
        b.check()
    b.set_active("a")  # a turn of "a" arrives: "a" is no longer evictable...
    b.check()
    b.set_idle("a")  # ...and after it "a" is the most recently used
    b.check()
    assert b.evictable_blocks() == 6 and list(b.idle) == ["b", "c", "a"]
    b.truncate("c", 10)  # an idle session shrinks: the idle sum follows
    b.check()
    assert b.evictable_blocks() == 5
    assert b.can_grow("d", 64) and not b.can_grow("d", 64, evict=False)
    assert b.grow("d", 64) == ["b", "c"]  # 4 blocks, 1 free: "b" (2) then "c" (1) go, "a" stays
    b.check()
    assert set(b.tokens) == {"a", "d"} and b.free_blocks == 0 and b.evictable_blocks() == 2


def test_a_session_never_evicts_itself_and_memory_error_when_full():
    b = BlockManager(4, 16)
    b.grow("a", 32)
    b.set_idle("a")
    b.check()
    assert not b.can_grow("a", 100)  # 7 blocks: even evicting everything else there are only 4
    assert b.can_grow("a", 64)
    b.grow("a", 64)  # grows in place, no eviction of itself
    b.check()
    assert b.held("a") == 64 and "a" not in b.idle
    with pytest.raises(MemoryError):
        b.grow("b", 1)
    b.check()


def test_random_operations_keep_the_invariants():
    rnd = random.Random(0)
    b = BlockManager(40, 8)
    sessions = [f"s{i}" for i in range(8)]
    for _ in range(2000):
        s, op = rnd.choice(sessions), rnd.random()
        if op < 0.4:
            n = b.held(s) + rnd.randint(1, 30)
            if b.can_grow(s, n):
                b.grow(s, n)
        elif op < 0.55:
            b.truncate(s, rnd.randint(0, b.held(s)))
        elif op < 0.75:
            b.set_idle(s)
        elif op < 0.9:
            b.set_active(s)
        else:
            b.release(s)
        b.check()
        assert 0 <= b.free_blocks <= b.num_blocks


def test_check_detects_broken_accounting():
    b = BlockManager(10, 16)
    b.grow("a", 20)
    b.set_idle("a")
    b.check()
    b.free_blocks += 1  # as if an operation forgot to charge a block
    with pytest.raises(AssertionError, match="block accounting"):
        b.check()
    b.free_blocks -= 1
    b.idle_blocks += 1
    with pytest.raises(AssertionError, match="idle block count"):
        b.check()


class Recorder:
    """Storage that records what the table tells it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def free(self, session: str) -> None:
        self.calls.append(("free", session))

    def truncate(self, session: str, n: int) -> None:
        self.calls.append(("truncate", session, n))


def test_attached_storage_follows_every_release_truncation_and_eviction():
    b, st = BlockManager(4, 16), Recorder()
    b.attach(st)
    b.grow("a", 40)
    b.truncate("a", 20)
    b.truncate("a", 30)  # not a truncation: nothing to tell
    b.set_idle("a")
    b.grow("b", 48)  # 3 blocks, 2 free: "a" is evicted
    b.release("b")
    b.check()
    assert st.calls == [("truncate", "a", 20), ("free", "a"), ("free", "b")]
