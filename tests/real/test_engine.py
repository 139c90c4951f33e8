"""TorchEngine on the `tiny` model: parity with transformers in every role path, log-probs, batching."""
import pickle

import pytest
import torch

from pearl.errors import ConfigError, ResourceError
from pearl.real.engine import TorchEngine
from pearl.real.models import load_model
from pearl.real.sampling import SamplingParams
from pearl.types import Role
from tests.real import hf_greedy, hf_logprobs

N = 10
GREEDY = SamplingParams(temperature=0, max_new_tokens=N, ignore_eos=True)


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny")


@pytest.fixture(scope="module")
def prompts(lm):
    tok = lm.tokenizer
    return [tok.chat([{"role": "user", "content": c}]) for c in
            ["Hi!", "Count to five: one, two,", "A much longer prompt that needs several prefill chunks."]]


@pytest.fixture(scope="module")
def refs(lm, prompts):
    return [hf_greedy(lm, p, N) for p in prompts]


def engine(lm, role=Role.MIXED, **kw):
    kw.setdefault("max_batched_tokens", 16)  # small budget: long prompts are prefilled in chunks
    return TorchEngine(lm, role, **kw)


def test_mixed_greedy_matches_transformers(lm, prompts, refs):
    outs = engine(lm).generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == refs
    assert all(o.finish_reason == "length" and o.versions == [0] * N for o in outs)


def test_prefill_handoff_decode_matches(lm, prompts, refs):
    pre, dec = engine(lm, Role.PREFILL), engine(lm, Role.DECODE)
    for p, ref in zip(prompts, refs):
        (out,) = pre.generate([p], GREEDY)
        assert out.finish_reason == "prefill" and out.kv is not None and out.kv.num_tokens == len(p)
        assert out.token_ids == ref[:1]
        blob = pickle.loads(pickle.dumps(out.kv))  # it must survive a process / Ray boundary
        dec.submit(out.req, GREEDY, kv=blob)
        (final,) = dec.run_until_done([out.rid])
        assert final.token_ids == ref
        assert len(final.logprobs) == N
    # The decode engine only computed each hand-off's first sampled token (the scheduler admits an
    # imported request through its prefill path, as a one-token chunk); never a prompt token.
    assert dec.stats.tokens_prefilled <= len(prompts)


def test_a_handoff_with_no_room_for_its_kv_is_prefilled_here_when_room_frees(lm, prompts, refs):
    """A decode worker whose KV is held by running requests cannot import a hand-off's KV: the request
    waits and computes its context here once there is room (a real 1P:1D run with long observations
    used to end on `no room for … imported KV tokens`), and its tokens are the same."""
    need = max(len(prompts[1]), len(prompts[2])) + N + 1
    cap = 16 * (-(-need // 16) + 1)  # room for one of the two requests, never both
    assert len(prompts[1]) + len(prompts[2]) + 2 * N > cap
    pre, dec = engine(lm, Role.PREFILL), engine(lm, Role.DECODE, kv_capacity_tokens=cap)
    first = dec.add_request(prompts[1], GREEDY, rid="first", session="first")
    dec.step()  # prefilled: its KV is held while it decodes
    (out,) = pre.generate([prompts[2]], GREEDY)
    dec.submit(out.req, GREEDY, kv=pickle.loads(pickle.dumps(out.kv)))
    assert dec.stats.kv_imports_dropped == 1
    done = {o.rid: o.token_ids for o in dec.run_until_done([first.rid, out.rid])}
    assert done == {first.rid: refs[1], out.rid: refs[2]}
    dec.blocks.check()


@pytest.mark.parametrize("k", [0, 1, 4])  # 0: migrated mid-prefill (partial KV)
def test_migration_mid_generation_matches(lm, prompts, refs, k):
    a, b = engine(lm), engine(lm)
    pending = {r.rid: r for r in (a.add_request(p, GREEDY) for p in prompts)}
    moved = []
    while pending:
        assert a.step() == []
        for rid, r in list(pending.items()):
            if r.num_generated >= k:  # each request leaves as soon as it has k tokens
                moved.append(pickle.loads(pickle.dumps(a.migrate_out(rid))))
                del pending[rid]
    moved.sort(key=lambda m: m.req.rid)
    assert a.load() == 0 and a.kv.tokens_used() == 0
    missing = sum(m.req.num_tokens - (m.kv.num_tokens if m.kv else 0) for m in moved)
    for m in moved:
        b.migrate_in(m)
    outs = b.run_until_done([m.req.rid for m in moved])
    assert [o.token_ids for o in outs] == refs
    assert b.stats.tokens_prefilled == missing  # only what had no KV yet is computed on b


def test_abort_keeps_tokens_and_resubmit_elsewhere_continues(lm, prompts, refs):
    a, b = engine(lm), engine(lm)
    req = a.add_request(prompts[1], GREEDY)
    for _ in range(5):
        a.step()
    out = a.abort(req.rid)
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < N
    assert out.token_ids == refs[1][: len(out.token_ids)]
    b.submit(out.req, GREEDY)  # no KV: its tokens are the prompt now, recomputed on b
    (final,) = b.run_until_done([req.rid])
    assert final.token_ids == refs[1] and len(final.logprobs) == N


def test_multi_turn_reuses_prefix_and_matches_fresh_run(lm, prompts):
    tok = lm.tokenizer
    e = engine(lm)
    (t1,) = e.generate([prompts[2]], GREEDY, sessions=["traj"])
    ctx2 = t1.req.token_ids + tok.chat([{"role": "user", "content": "And then?"}])
    reused_before = e.stats.tokens_reused
    assert e.holds("traj") == len(t1.req.token_ids) - 1
    (t2,) = e.generate([ctx2], GREEDY, sessions=["traj"])
    assert e.stats.tokens_reused - reused_before == len(t1.req.token_ids) - 1  # only new tokens prefilled
    (fresh,) = engine(lm).generate([ctx2], GREEDY)
    assert t2.token_ids == fresh.token_ids == hf_greedy(lm, ctx2, N)


def test_diverging_context_reuses_only_common_prefix(lm, prompts):
    e = engine(lm)
    e.generate([prompts[2]], GREEDY, sessions=["s"])
    ctx = prompts[2][:20] + [65, 66, 67]
    before = e.stats.tokens_reused
    (out,) = e.generate([ctx], GREEDY, sessions=["s"])
    assert e.stats.tokens_reused - before == 20
    assert out.token_ids == hf_greedy(lm, ctx, N)


def test_logprobs_match_full_sequence_recomputation(lm, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, ignore_eos=True)
    outs = engine(lm).generate(prompts, params)
    for p, o in zip(prompts, outs):
        ref = hf_logprobs(lm, o.req.token_ids, len(p))
        assert torch.allclose(torch.tensor(o.logprobs), ref, atol=1e-4)


def test_batched_ragged_decode_equals_one_at_a_time(lm, prompts):
    params = SamplingParams(temperature=0.8, max_new_tokens=N, seed=3, ignore_eos=True)
    together = engine(lm, max_batched_tokens=64).generate(prompts, params)
    for p, o in zip(prompts, together):
        (alone,) = engine(lm, max_batched_tokens=64).generate([p], params)
        assert alone.token_ids == o.token_ids
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(o.logprobs), atol=1e-5)


def test_seeded_sampling_survives_migration(lm, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=N, seed=11, ignore_eos=True)
    (ref,) = engine(lm).generate([prompts[0]], params)
    a, b = engine(lm), engine(lm)
    req = a.add_request(prompts[0], params)
    for _ in range(4):
        a.step()
    b.migrate_in(a.migrate_out(req.rid))
    (out,) = b.run_until_done([req.rid])
    assert out.token_ids == ref.token_ids


def test_stop_conditions(lm, prompts, refs):
    e = engine(lm)
    eos_tok = refs[2][3]
    (o,) = e.generate([prompts[2]], SamplingParams(temperature=0, max_new_tokens=N, stop_token_ids=(eos_tok,)))
    assert o.finish_reason == "eos" and o.token_ids == refs[2][:4]
    text = lm.tokenizer.decode(refs[2][:6], skip_special=False)
    stop = text[-2:]
    (o,) = e.generate([prompts[2]], SamplingParams(temperature=0, max_new_tokens=N, ignore_eos=True, stop=(stop,)))
    assert o.finish_reason == "stop" and o.stop == stop and stop in lm.tokenizer.decode(o.token_ids, False)
    assert len(o.token_ids) <= 6


def test_allowed_tokens_mask(lm, prompts):
    allowed = (ord("a"), ord("b"), ord("c"))
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=1, allowed_token_ids=allowed, ignore_eos=True)
    (o,) = engine(lm).generate([prompts[0]], params)
    assert set(o.token_ids) <= set(allowed)
    assert all(lp <= 0 for lp in o.logprobs)


def test_update_weights_tags_versions(lm, prompts):
    e = engine(lm)
    req = e.add_request(prompts[0], GREEDY)
    while req.num_generated < 3:
        e.step()
    sd = {k: v * 1.01 for k, v in lm.hf_model.state_dict().items()}
    e.update_weights(sd, version=5)
    (o,) = e.run_until_done([req.rid])
    assert o.versions[:3] == [0, 0, 0] and set(o.versions[3:]) == {5}


def test_small_kv_capacity_preempts_and_still_matches(lm, prompts, refs):
    e = engine(lm, kv_capacity_tokens=160, block_size=16, max_batched_tokens=64)
    outs = e.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == refs
    assert e.scheduler.preemptions >= 1  # the case this test exists for
    assert e.kv.tokens_used() <= e.kv_capacity


def test_retained_sessions_are_evicted_and_freed(lm, prompts):
    e = engine(lm, kv_capacity_tokens=128, block_size=16)
    for i in range(4):
        e.generate([prompts[1]], GREEDY, sessions=[f"s{i}"])
    assert set(e.kv.sessions()) == {s for s in e.blocks.tokens}
    assert len(e.kv.sessions()) < 4


def test_user_errors(lm, prompts):
    e = engine(lm)
    with pytest.raises(ConfigError):
        TorchEngine(lm, "both")
    with pytest.raises(ConfigError):
        e.add_request([1, 2, 999999], GREEDY)
    with pytest.raises(ResourceError):
        engine(lm, kv_capacity_tokens=32).add_request(prompts[2], GREEDY)
    small = engine(lm, kv_capacity_tokens=32)
    small.add_request(prompts[0], SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True))
    with pytest.raises(ResourceError, match="kv_capacity_tokens"):  # outgrows the cache while decoding
        small.run_until_done()
    e.add_request(prompts[0], GREEDY, session="x")
    with pytest.raises(ConfigError):
        e.add_request(prompts[1], GREEDY, session="x")
    with pytest.raises(ConfigError):
        SamplingParams(top_p=0)


def test_abort_keeping_kv_resumes_here_without_recompute(lm, prompts, refs):
    e = engine(lm)
    req = e.add_request(prompts[1], GREEDY)
    while req.num_generated < 4:
        e.step()
    out = e.abort(req.rid, keep_kv=True)
    assert e.holds(req.session) == req.num_tokens - 1
    before = e.stats.tokens_reused
    e.submit(out.req, GREEDY)
    assert e.stats.tokens_reused - before == req.num_tokens - 1
    assert e.run_until_done([req.rid])[0].token_ids == refs[1]


def test_without_retention_sessions_leave_no_kv(lm, prompts):
    e = engine(lm, retain_sessions=False)
    e.generate(prompts, GREEDY, sessions=["a", "b", "c"])
    assert e.kv.sessions() == [] and e.kv_used() == 0 and e.holds("a") == 0


def assert_one_kv_truth(e: TorchEngine) -> None:
    """The block table says which sessions hold how many tokens of KV; the tensors never disagree."""
    e.blocks.check()
    e.kv.check()
    held = e.blocks.tokens
    assert set(e.kv.sessions()) <= set(held), "KV tensors for a session the block table does not hold"
    for s in e.kv.sessions():
        assert e.kv.length(s) <= held[s]
    for s in e.blocks.idle:  # retained: exactly what the table says, and that is what holds() reports
        assert e.kv.length(s) == held[s] == e.holds(s)
    for r in e.requests():  # running or queued: the tensors hold exactly the computed positions
        assert e.kv.length(r.session) == r.num_computed and r.num_computed <= held.get(r.session, 0)


def test_kv_tensors_follow_the_block_table_through_preemption_eviction_reuse_and_abort(lm, prompts, refs):
    tok = lm.tokenizer
    e = engine(lm, kv_capacity_tokens=160, block_size=16, max_batched_tokens=64)
    reqs = [e.add_request(p, GREEDY, session=f"s{i}") for i, p in enumerate(prompts)]
    outs = {}
    while e.has_work():
        outs.update((o.rid, o) for o in e.step())
        assert_one_kv_truth(e)
    assert e.scheduler.preemptions >= 1 and [outs[r.rid].token_ids for r in reqs] == refs
    # a second turn of a retained session (prefix reuse), a turn that evicts, an abort keeping the KV
    ctx = outs[reqs[2].rid].req.token_ids + tok.chat([{"role": "user", "content": "More?"}])
    r2 = e.add_request(ctx, GREEDY, session="s2")
    assert_one_kv_truth(e)
    while r2.num_generated < 3:
        e.step()
        assert_one_kv_truth(e)
    out = e.abort(r2.rid, keep_kv=True)
    assert_one_kv_truth(e)
    assert e.holds("s2") == r2.num_computed == r2.num_tokens - 1
    e.submit(out.req, GREEDY)
    assert_one_kv_truth(e)
    (final,) = e.run_until_done([r2.rid])
    assert final.token_ids == hf_greedy(lm, ctx, N)
    assert_one_kv_truth(e)
    e.drop_session("s2")
    assert "s2" not in e.kv.sessions() and e.holds("s2") == 0
    assert_one_kv_truth(e)
    r3 = e.add_request(prompts[2], GREEDY, session="s3")  # aborted mid-prefill, keeping its KV
    e.step()
    assert 0 < r3.num_computed < len(prompts[2])
    e.abort(r3.rid, keep_kv=True)
    assert_one_kv_truth(e)
    assert e.holds("s3") == r3.num_computed


def test_engines_sharing_weights_step_at_once_on_threads(lm):
    """A worker started on a lent device shares the live worker's weights and, with parallel steps, runs
    at the same time on another thread. Its batched decode must not use the other's scratch copy of
    the KV: before the mirror moved to the KV cache, every greedy output of both differed from the
    same engine stepped alone (8 of 8)."""
    import threading

    tok = lm.tokenizer
    ps = [tok.chat([{"role": "user", "content": f"Say {i} things about number {i * 7}"}]) for i in range(8)]
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    alone = [o.token_ids for o in engine(lm, max_batched_tokens=512).generate(ps[:4], params)]
    alone += [o.token_ids for o in engine(lm, max_batched_tokens=512).generate(ps[4:], params)]
    a = engine(lm, max_batched_tokens=512, num_threads=1)
    b = engine(lm, max_batched_tokens=512, num_threads=1, share_weights_with=a)
    assert b.decoder is a.decoder  # one copy of the weights
    got: dict[int, list] = {}

    def run(k, e, prompts):
        got[k] = [o.token_ids for o in e.generate(prompts, params)]

    threads = [threading.Thread(target=run, args=(0, a, ps[:4])), threading.Thread(target=run, args=(1, b, ps[4:]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] + got[1] == alone
