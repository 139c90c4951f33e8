"""`TorchEngine`: a real inference engine on CPU (or one GPU) in the three PEARL roles.

The batching policy is the shared `pearl.engine.scheduler.Scheduler` (the emulated engine mirrors its
policy; `pearl.engine.emulated` lists where it differs) over a `BlockManager`, the one owner of which
session holds how many tokens of KV: the `KVCache` is bound to it, and every free or truncation (finish,
abort, preemption, eviction, prefix reuse, drop) is made on the block table, which the tensors follow.
This class adds what only a real engine has: token ids, tensors (`ModelRunner`, `KVCache`), sampling,
stop conditions, weights.

One `step()` is schedule → run → postprocess:
1. `Scheduler.schedule()` picks decodes (one token each) and prefill chunks within the token budget.
2. The runner runs the ragged batch and samples a token for every request whose KV now covers its
   context; the engine appends it (`Request.append_token`, tagged with the weights' version), then
   `Scheduler.step_done` advances `num_computed`.
3. Requests that hit eos / a stop string / max_new_tokens (or, in the `prefill` role, their first token)
   finish; their session's KV is retained (idle, evictable LRU) so the trajectory's next turn, whose
   token ids extend the cached ones, prefills only its new tokens.

Roles: `prefill` requests stop after the first token and their output carries the prompt's KV as a
`KVBlob`; a `decode` engine `submit`s the same request with that blob and continues. `abort` keeps the
generated tokens on the request, so it can be resubmitted anywhere (its tokens become the prompt,
the counters keep counting); `migrate_out`/`migrate_in` add the KV so nothing is recomputed.
The engine is synchronous and single-threaded: callers serialise `submit`, `step` and `update_weights`.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Iterable, Mapping

import torch

from pearl.engine.request import Request
from pearl.engine.scheduler import Scheduler
from pearl.errors import ConfigError, ResourceError
from pearl.kv.blocks import BlockManager
from pearl.real.engine_api import EngineStats, Migration, Output
from pearl.real.kvcache import KVBlob, KVCache
from pearl.real.modeling import Decoder
from pearl.real.models import LoadedModel, Tokenizer
from pearl.real.runner import ModelRunner
from pearl.real.sampling import Sampler, SamplingParams
from pearl.types import Role


class TorchEngine:
    """Satisfies `pearl.real.engine_api.RolloutEngine` with every capability (all roles, KV transfer)."""

    roles = (Role.MIXED, Role.PREFILL, Role.DECODE)
    supports_kv_transfer = True

    def __init__(self, model: LoadedModel, role: Role | str = Role.MIXED, *, max_num_seqs: int = 32,
                 max_batched_tokens: int = 512, kv_capacity_tokens: int = 65536, block_size: int = 16,
                 dtype: torch.dtype | str = torch.float32, seed: int = 0, version: int = 0, wid: int = 0,
                 retain_sessions: bool = True, log_steps: bool = False, num_threads: int | None = None,
                 share_weights_with: "TorchEngine | None" = None):
        # torch's intra-op thread count is per OS thread: it is set here and again on whichever
        # thread steps the engine (`step`). One engine per core wants 1: OpenMP threads waiting at
        # barriers for a core another process holds make the many small kernels of a decode step slower.
        self.num_threads = num_threads
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if isinstance(dtype, str):
            if dtype not in ("float32", "bfloat16"):
                raise ConfigError(f"engine dtype {dtype!r} is not one of float32, bfloat16")
            dtype = getattr(torch, dtype)
        try:
            self.role = Role(role)
        except ValueError:
            raise ConfigError(f"engine role {role!r} is not one of mixed, prefill, decode") from None
        if kv_capacity_tokens < block_size:
            raise ConfigError(f"engine kv_capacity_tokens ({kv_capacity_tokens}) is below one block ({block_size})")
        self.wid = wid
        self.tokenizer: Tokenizer = model.tokenizer
        self.model_name = model.spec.name
        # Engines in one process (say a prefill and a decode worker on one machine) may share one copy
        # of the weights; they then share its version too, so update them together.
        self.decoder = (share_weights_with.decoder if share_weights_with is not None
                        else Decoder.from_hf(model.hf_model, dtype, version))
        # The block table owns which session holds how many tokens of KV; the tensors follow it.
        self.blocks = BlockManager(kv_capacity_tokens // block_size, block_size)
        self.kv = KVCache(self.decoder.kv_layout(), self.decoder.device, table=self.blocks)
        self.scheduler = Scheduler(self.role, self.blocks, max_num_seqs, max_batched_tokens)
        self.runner = ModelRunner(self.decoder, self.kv, Sampler(self.decoder.shape.vocab, seed))
        self.retain_sessions = retain_sessions
        self.log_steps = log_steps
        self.stats = EngineStats()
        self._live: dict[Any, Request] = {}
        self._params: dict[Any, SamplingParams] = {}
        self._sessions: dict[str, Any] = {}  # session -> rid of its live request
        self._rids = itertools.count()

    # ------------------------------------------------------------ views (the router's contract)
    @property
    def version(self) -> int:
        return self.decoder.version

    @property
    def kv_capacity(self) -> int:
        return self.blocks.num_blocks * self.blocks.block_size

    def kv_used(self) -> int:
        return self.blocks.used_blocks * self.blocks.block_size

    def load(self) -> int:
        return len(self._live)

    def holds(self, session: str) -> int:
        """Tokens of a retained (idle) session's KV held here: what its next turn need not prefill."""
        return self.blocks.held(session) if session in self.blocks.idle else 0

    @property
    def pre_pending(self) -> int:
        return sum(r.pending for r in self._live.values() if not r.decoding)

    def requests(self) -> list[Request]:
        return list(self._live.values())

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------ submission
    def add_request(self, token_ids: Iterable[int], params: SamplingParams | None = None, *,
                    session: str | None = None, rid: Any = None, kv: KVBlob | None = None) -> Request:
        """Convenience: build a Request for a context (prompt incl. earlier turns) and submit it."""
        params = params or SamplingParams()
        rid = next(self._rids) if rid is None else rid
        ids = list(token_ids)
        req = Request(rid=rid, session=session if session is not None else f"r{rid}", num_tokens=len(ids),
                      max_new_tokens=params.max_new_tokens, token_ids=ids)
        self.submit(req, params, kv=kv)
        return req

    def submit(self, req: Request, params: SamplingParams, kv: KVBlob | None = None) -> None:
        """Queue a request. Its KV may already be here (a retained session whose tokens the context
        extends: only the new tokens are prefilled) or come with it (`kv`: hand-off, migration, or a
        prefix fetched from a peer). The request may carry tokens generated elsewhere (resume)."""
        ids = req.token_ids
        if ids is None or len(ids) != req.num_tokens or req.num_tokens < 1:
            raise ConfigError(f"request {req.rid}: token_ids must be a non-empty list of num_tokens ids")
        if req.rid in self._live:
            raise ConfigError(f"request id {req.rid!r} is already running on engine {self.wid}")
        if req.session in self._sessions:
            raise ConfigError(f"session {req.session!r} already has a request running on engine {self.wid}")
        if req.num_tokens + 1 > self.kv_capacity:
            raise ResourceError(f"request {req.rid}: {req.num_tokens} context tokens do not fit the engine's "
                                f"KV capacity of {self.kv_capacity} tokens")
        bad = [t for t in ids if not 0 <= t < self.decoder.shape.vocab]
        if bad:
            raise ConfigError(f"request {req.rid}: token ids {bad[:5]} are outside the vocabulary "
                              f"(size {self.decoder.shape.vocab})")
        req.max_new_tokens = params.max_new_tokens
        req.prefill_only = self.role is Role.PREFILL
        if kv is not None:
            try:
                self.import_kv(req.session, kv)
            except ResourceError:  # the KV in use leaves no room for it now: prefill the context here
                self.stats.kv_imports_dropped += 1  # when the scheduler has room (nothing is lost)
        self._reuse_prefix(req.session, ids)
        self.scheduler.add(req)  # sets num_computed from the KV held for the session (truncating it)
        self.stats.tokens_reused += req.num_computed
        self._live[req.rid], self._params[req.rid], self._sessions[req.session] = req, params, req.rid

    def _reuse_prefix(self, session: str, ids: list[int]) -> None:
        """Cut the session's KV back to the longest prefix shared with `ids` (the tensors follow)."""
        m = 0
        for a, b in zip(self.kv.token_ids(session), ids):
            if a != b:
                break
            m += 1
        if m == 0:
            self.blocks.release(session)
        else:
            self.blocks.truncate(session, m)

    def import_kv(self, session: str, blob: KVBlob) -> None:
        """Install a session's KV computed elsewhere (replacing any held here) and account its blocks."""
        if session in self._sessions:
            raise ConfigError(f"cannot import KV into session {session!r}: a request of it is running")
        self.drop_session(session)
        try:
            self.blocks.grow(session, blob.num_tokens)
        except MemoryError:
            raise ResourceError(f"engine {self.wid}: no room for {blob.num_tokens} imported KV tokens "
                                f"({self.blocks.free_blocks} free blocks)") from None
        try:
            self.kv.import_(session, blob)
        except Exception:
            self.blocks.release(session)
            raise
        self.blocks.set_idle(session)

    def export_kv(self, session: str) -> KVBlob:
        return self.kv.export(session, self.version)

    def drop_session(self, session: str) -> None:
        """Forget a retained session's KV (the trajectory ended, or its KV moved elsewhere)."""
        if session in self._sessions:
            raise ConfigError(f"cannot drop session {session!r}: a request of it is running")
        self.blocks.release(session)

    # ------------------------------------------------------------ the step
    def step(self) -> list[Output]:
        """Run one engine step; return the requests that finished in it."""
        batch = self.scheduler.schedule()
        if batch is None:
            if self.scheduler.has_work():  # nothing runs by itself in a synchronous engine: stuck
                stuck = self.scheduler.running or list(self.scheduler.waiting)
                r = stuck[0]
                raise ResourceError(f"engine {self.wid}: request {r.rid} needs KV for {r.num_tokens} tokens but "
                                    f"the engine holds {self.kv_capacity} (raise kv_capacity_tokens)")
            return []
        threads = torch.get_num_threads()
        if self.num_threads is not None and threads != self.num_threads:
            threads = self.num_threads
            torch.set_num_threads(threads)
        t0, c0 = time.perf_counter(), time.thread_time()
        result = self.runner.run(batch.items, self._params)
        version = self.decoder.version
        for req, tok, lp in result.sampled:
            req.append_token(tok, lp, version)
        self.scheduler.step_done(batch)
        dt = time.perf_counter() - t0
        st = self.stats
        st.steps += 1
        st.steps_by_threads[threads] = st.steps_by_threads.get(threads, 0) + 1
        st.busy_s += dt
        st.cpu_s += time.thread_time() - c0
        st.tokens_decoded += batch.n_decode
        st.tokens_prefilled += batch.prefill_tokens
        st.evictions = self.scheduler.evictions
        if self.log_steps:
            st.step_log.append((batch.n_decode, batch.decode_context, batch.prefill_tokens, dt))
        outs = []
        for req, tok, _ in result.sampled:
            reason, stop = self._finish_reason(req, tok)
            if reason is not None:
                outs.append(self._finish(req, reason, stop))
        return outs

    def _finish_reason(self, req: Request, tok: int) -> tuple[str | None, str | None]:
        p = self._params[req.rid]
        stop_ids = self.tokenizer.stop_token_ids if p.stop_token_ids is None else p.stop_token_ids
        if not p.ignore_eos and tok in stop_ids:
            return "eos", None
        if p.stop:
            hit = self._stop_string(req, p.stop)
            if hit is not None:
                return "stop", hit
        if req.num_generated >= req.max_new_tokens:
            return "length", None
        if req.prefill_only:
            return "prefill", None
        return None, None

    def _stop_string(self, req: Request, stops: tuple[str, ...]) -> str | None:
        # Only the tail can contain a new match (an earlier one would have stopped us earlier); a token
        # is at least one byte and a character at most four, hence the window.
        window = 4 * max(len(s) for s in stops) + 4
        gen = req.token_ids[req.num_tokens - req.num_generated:]
        text = self.tokenizer.decode(gen[-window:], skip_special=False)
        return next((s for s in stops if s in text), None)

    def _finish(self, req: Request, reason: str, stop: str | None = None) -> Output:
        kv = self.export_kv(req.session) if reason == "prefill" else None
        self.scheduler.finish(req, retain=self.retain_sessions)
        self._forget(req)
        self.stats.finished += 1
        return Output(req, reason, kv, stop)

    def _forget(self, req: Request) -> None:
        self._live.pop(req.rid, None)
        self._params.pop(req.rid, None)
        self._sessions.pop(req.session, None)

    # ------------------------------------------------------------ leaving early
    def abort(self, rid: Any, keep_kv: bool = False) -> Output:
        """Take a request out; its generated tokens (and log-probs, versions) stay on `Output.req`, which
        can be `submit`ted again here or elsewhere to continue. `keep_kv`: retain the session's KV here
        (idle), so a resubmission to this engine recomputes nothing."""
        req = self._live.get(rid)
        if req is None:
            raise KeyError(f"no running request {rid!r} on engine {self.wid}")
        self.scheduler.abort(req, release=not keep_kv)  # keep_kv: the computed KV, retained idle
        self._forget(req)
        self.stats.aborted += 1
        return Output(req, "abort")

    def migrate_out(self, rid: Any) -> Migration:
        """Abort a request and package it with its KV for `migrate_in` on another engine."""
        req = self._live.get(rid)
        if req is None:
            raise KeyError(f"no running request {rid!r} on engine {self.wid}")
        params = self._params[rid]
        kv = self.export_kv(req.session) if req.num_computed else None
        self.abort(rid)
        return Migration(req, params, kv)

    def migrate_in(self, m: Migration) -> Request:
        self.submit(m.req, m.params, kv=m.kv)
        return m.req

    def set_role(self, role: Role | str) -> None:
        """Serve as `role` from the next step on (the runtime moves in-flight requests out first)."""
        self.role = self.scheduler.role = Role(role)

    def close(self) -> None:
        """Nothing to release: the weights and KV tensors go with the object."""

    def abort_all(self) -> list[Output]:
        return [self.abort(rid) for rid in list(self._live)]

    # ------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights (Hugging Face names; all or some). Tokens sampled from now on carry
        `version`. KV already computed (in-flight requests, retained sessions) is kept, as in
        asynchronous RL systems: recomputing every context on each update would cost a full prefill."""
        self.decoder.load_state_dict(state_dict, version)

    # ------------------------------------------------------------ convenience
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 sessions: list[str] | None = None, max_steps: int = 1_000_000) -> list[Output]:
        """Submit the prompts, step until all are done, return their outputs in prompt order."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        reqs = [self.add_request(p, sp, session=None if sessions is None else sessions[i])
                for i, (p, sp) in enumerate(zip(prompts, plist))]
        return self.run_until_done([r.rid for r in reqs], max_steps)

    def run_until_done(self, rids: list[Any] | None = None, max_steps: int = 1_000_000) -> list[Output]:
        want = set(self._live) if rids is None else set(rids)
        done: dict[Any, Output] = {}
        for _ in range(max_steps):
            if not (want - done.keys()):
                break
            for o in self.step():
                done[o.rid] = o
            if not self.has_work() and want - done.keys():
                raise RuntimeError(f"engine {self.wid} went idle with requests unfinished")
        order = list(rids) if rids is not None else sorted(done, key=str)
        return [done[r] for r in order if r in done]
