"""Per-session KV storage: growth, truncate, export/import, accounting."""
import pickle

import pytest
import torch

from pearl.errors import ConfigError
from pearl.kv.blocks import BlockManager
from pearl.real.kvcache import KVCache, KVLayout

LAY = KVLayout(layers=2, kv_heads=2, head_dim=4, dtype=torch.float32)


def fill(kv, session, n, start=0):
    kv.reserve(session, start + n)
    buf = kv.buffer(session)
    buf[:, :, :, start:start + n] = torch.arange(start, start + n, dtype=torch.float32)[None, None, None, :, None]
    kv.commit(session, start, list(range(100 + start, 100 + start + n)))


def test_growth_keeps_contents():
    kv = KVCache(LAY)
    fill(kv, "s", 5)
    fill(kv, "s", 60, start=5)  # forces a reallocation past the first 32 positions
    assert kv.length("s") == 65 and kv.token_ids("s")[:3] == [100, 101, 102]
    assert torch.equal(kv.buffer("s")[1, 1, 0, :65, 0], torch.arange(65, dtype=torch.float32))


def test_export_import_roundtrip_through_pickle():
    a, b = KVCache(LAY), KVCache(LAY)
    fill(a, "s", 10)
    blob = pickle.loads(pickle.dumps(a.export("s", version=3)))
    assert blob.num_tokens == 10 and blob.version == 3 and blob.nbytes == 10 * LAY.bytes_per_token
    b.import_("t", blob)
    assert b.length("t") == 10 and b.token_ids("t") == a.token_ids("s")
    assert torch.equal(b.buffer("t")[:, :, :, :10], a.buffer("s")[:, :, :, :10])


def test_import_rejects_another_models_kv():
    a = KVCache(KVLayout(3, 2, 4, torch.float32))
    fill(a, "s", 4)
    with pytest.raises(ConfigError, match="layers"):
        KVCache(LAY).import_("s", a.export("s"))


def test_truncate_free_and_accounting():
    kv = KVCache(LAY)
    fill(kv, "a", 10)
    fill(kv, "b", 4)
    assert kv.tokens_used() == 14 and kv.bytes_used() == 14 * LAY.bytes_per_token
    assert kv.bytes_reserved() >= kv.bytes_used()
    kv.truncate("a", 3)
    assert kv.length("a") == 3 and kv.token_ids("a") == [100, 101, 102]
    kv.free("a")
    assert not kv.has("a") and kv.tokens_used() == 4
    with pytest.raises(RuntimeError):
        kv.commit("b", 7, [1])  # writing past a hole is a bug, not a silent gap


def test_bound_cache_follows_the_block_table():
    table = BlockManager(6, 4)
    kv = KVCache(LAY, table=table)
    table.grow("a", 10)
    fill(kv, "a", 10)
    table.truncate("a", 6)  # prefix reuse / abort keeping KV: the tensors follow
    assert kv.length("a") == 6 and kv.token_ids("a") == list(range(100, 106))
    table.set_idle("a")
    kv.check()
    table.grow("b", 4)
    with pytest.raises(RuntimeError, match="block table"):
        fill(kv, "b", 5)  # a position the table has not given the session
    fill(kv, "b", 4)
    kv.check()
    assert table.grow("c", 16) == ["a"]  # eviction frees the evicted session's tensors
    assert not kv.has("a") and kv.has("b")
    table.release("b")  # finish without retention, abort, preemption, drop
    assert kv.sessions() == []
    kv.check()


def test_bound_cache_imports_only_what_the_table_holds():
    src = KVCache(LAY)
    fill(src, "s", 8)
    table = BlockManager(10, 4)
    kv = KVCache(LAY, table=table)
    with pytest.raises(RuntimeError, match="block table"):
        kv.import_("s", src.export("s"))
    table.grow("s", 8)
    kv.import_("s", src.export("s"))
    table.set_idle("s")
    kv.check()
    kv.truncate("s", 5)  # behind the table's back: check() says so
    with pytest.raises(AssertionError, match="block table"):
        kv.check()
