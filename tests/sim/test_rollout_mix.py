"""Rollout devices of two kinds (`cluster.rollout_mix`): the last rollout devices are of another
hardware, each worker runs at its own devices' rates, and a fixed layout can put its prefill workers
on one kind and its decode workers on the other."""
from __future__ import annotations

from pearl.config import ScenarioConfig, parse_config
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.runtime.sim import Simulator
from pearl.types import Role


def _cfg(mix: dict | None = None, hardware: str = "h800", layout: dict | None = None) -> ScenarioConfig:
    cluster = {"hardware": hardware, "rollout_devices": 8, "train_devices": 8, **({"rollout_mix": mix} if mix else {})}
    return parse_config({"duration_s": 3600, "max_train_steps": 3, "cluster": cluster,
                         "workload": {"profile": "search"}, "layout": layout or {},
                         "rl": {"prompts_per_batch": 8, "group_size": 8, "staleness": 1}}, ScenarioConfig)


def test_each_worker_runs_at_its_own_hardware():
    sim = Simulator(_cfg({"h20": 4}))
    sim.run()
    on = {e.devices[0]: e for e in sim.all_engines}
    h800 = PerfModel(get_model("qwen3-8b"), get_hardware("h800"), tp=1)
    h20 = PerfModel(get_model("qwen3-8b"), get_hardware("h20"), tp=1)
    assert sorted(sim.device_hw) == sim.rollout_devices[4:]
    for d in sim.rollout_devices:
        want = h20 if d in sim.device_hw else h800
        assert on[d].kv_capacity == want.kv_capacity_tokens()
        assert sim.perf_on((d,)).decode_time(32, 96_000) == want.decode_time(32, 96_000)  # its own efficiencies
    # H20: more memory (96 vs 80 GiB), a seventh of the compute: a prefill-heavy step is much slower there.
    assert on[sim.rollout_devices[-1]].kv_capacity > on[sim.rollout_devices[0]].kv_capacity
    assert sim.perf_on((sim.rollout_devices[-1],)).prefill_time(4096, 0) > \
        3 * sim.perf_on((sim.rollout_devices[0],)).prefill_time(4096, 0)


def test_prefill_on_one_kind_decode_on_the_other_lands_between_the_pure_clusters():
    pd = {"mode": "disaggregated", "prefill": 4, "decode": 4}
    runs = {}
    for name, cfg in [("h800", _cfg(layout=pd)), ("h20", _cfg(hardware="h20", layout=pd)),
                      ("mix", _cfg({"h20": 4}, layout=pd))]:
        sim = Simulator(cfg)
        res = sim.run()
        assert res["train_steps"] == 3, name
        runs[name] = (sim, res["throughput"]["trajectories_per_s"], res["layout_final"])
    sim = runs["mix"][0]
    roles = {e.devices[0]: e.role for e in sim.all_engines}
    assert all(roles[d] is Role.PREFILL for d in sim.rollout_devices[:4])
    assert all(roles[d] is Role.DECODE and d in sim.device_hw for d in sim.rollout_devices[4:])
    assert runs["mix"][2] == "4P:4D (4P on h800; 4D on h20)" and runs["h800"][2] == "4P:4D"  # the summary says where
    h800, h20, mix = (runs[k][1] for k in ("h800", "h20", "mix"))
    assert h20 < mix < h800, (h20, mix, h800)


def test_without_a_mix_every_worker_is_on_the_cluster_hardware():
    for cfg in (_cfg(), _cfg({"H800": 4})):  # a mix of the cluster's own kind is no mix
        sim = Simulator(cfg)
        res = sim.run()
        assert sim.device_hw == {} and "on" not in res["layout_final"]
        assert all(sim.perf_on(e.devices) is sim.perf for e in sim.all_engines)


def test_the_router_weighs_speed_where_the_kv_does_not_bind():
    """Routing by KV fullness alone sends an H20 (more memory, so emptier) about as much as an H800
    (it decoded 0.86x an H800's tokens here, at 0.66x the speed). A worker now counts as fuller by its
    relative decode speed (`rate` / the faster one's) while its KV is far from full (** (1 - fullness)), so on this
    search run the H20s get about their share; near full, memory decides (KV-bound swe keeps its
    throughput: docs/scenarios.md)."""
    sim = Simulator(_cfg({"h20": 4}))  # colocated x8: 4 H800, 4 H20
    sim.run()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    fast = [e for e in sim.all_engines if e.devices[0] not in sim.device_hw]
    slow = [e for e in sim.all_engines if e.devices[0] in sim.device_hw]
    top = max(e.rate for e in fast)
    assert {e.rate for e in fast} == {top} and all(0.5 < e.rate / top < 0.8 for e in slow)
    assert mean([e.tokens_decoded for e in slow]) < 0.78 * mean([e.tokens_decoded for e in fast])
