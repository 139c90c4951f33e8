"""A pool of workers on two kinds of device, priced as two parts sharing the batch
(`pearl.control.predictor_mix`): it reduces to the one-kind predictor when both kinds are the same,
and splits the batch as the router does."""
import pytest

from pearl.config import EngineConfig, WorkloadConfig
from pearl.control.predictor import BatchState, TrajectoryProgress, WorkloadStats, predict_many, prepare
from pearl.control.predictor_mix import KindPart, predict_two_kinds, router_share
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape
from pearl.workloads import Workload

M = get_model("qwen3-8b")
H800, H20 = PerfModel(M, get_hardware("h800")), PerfModel(M, get_hardware("h20"))
B = BatchState.fresh(128)


def _stats(profile: str) -> WorkloadStats:
    return WorkloadStats.from_workload(Workload(WorkloadConfig(profile=profile)), samples=512)


def _one_kind(shape: LayoutShape, stats: WorkloadStats, dpn: int = 8) -> float:
    reps = prepare(stats, B, 64, 8)
    return predict_many([shape], [H800], EngineConfig(), stats, B, dpn, reps=reps, tol=1e-3, grid_points=48)[0].completion_s


@pytest.mark.parametrize("profile", ["swe", "search"])
def test_two_parts_of_one_kind_are_the_one_kind_layout(profile):
    st = _stats(profile)
    # colocated: 6 + 10 H800 workers, the batch split by the router (equal speed: by memory, 6/16)
    got = predict_two_kinds([KindPart(6, H800), KindPart(10, H800)], EngineConfig(), st, B)
    assert got.breakdown["share"] == pytest.approx(6 / 16, abs=1e-6)
    assert got.completion_s == pytest.approx(_one_kind(LayoutShape.colocated(16), st), rel=0.03)
    # a decode pool behind 2 prefill workers (all on one node, so every hand-off is at NVLink rate)
    got = predict_two_kinds([KindPart(6, H800, True), KindPart(8, H800, True)], EngineConfig(), st, B,
                            prefill=(2, H800), devices_per_node=16)
    assert got.completion_s == pytest.approx(_one_kind(LayoutShape.disaggregated(2, 14), st, dpn=16), rel=0.03)


def test_the_router_gives_the_slower_kind_fewer_sessions_until_memory_decides():
    parts = [KindPart(8, H800), KindPart(8, H20)]  # the H20 decodes slower and holds more KV
    cap = [8 * p.perf.kv_capacity_tokens() for p in parts]
    light = router_share(parts, 0.01 * sum(cap))
    full = router_share(parts, sum(cap))
    speed = H800.decode_time(32, 1 << 17) / H20.decode_time(32, 1 << 17)  # the H20's, relative
    # far from full, speed decides: each kind's KV fills in proportion to its speed
    assert light == pytest.approx(cap[0] / (cap[0] + speed * cap[1]), rel=0.02)
    assert full == pytest.approx(cap[0] / sum(cap))  # full, memory decides: fewer on the H800s
    assert full < 0.5 < light


def test_a_share_that_ends_the_batch_first_is_no_slower_than_the_routers():
    st = _stats("math-tool")
    parts = [KindPart(8, H800), KindPart(8, H20)]
    best = predict_two_kinds(parts, EngineConfig(), st, B, share="best")
    router = predict_two_kinds(parts, EngineConfig(), st, B, share="router")
    assert best.completion_s <= router.completion_s * 1.001


def test_bad_requests_are_refused_with_the_reason():
    st = _stats("game")
    with pytest.raises(ValueError, match="two parts"):
        predict_two_kinds([KindPart(8, H800)], EngineConfig(), st, B)
    with pytest.raises(ValueError, match="share must be in"):
        predict_two_kinds([KindPart(8, H800), KindPart(8, H20)], EngineConfig(), st, B, share=1.5)
    started = BatchState(trajectories=(TrajectoryProgress(1, 100, st.spec(0)),))
    with pytest.raises(ValueError, match="not yet started"):
        predict_two_kinds([KindPart(8, H800), KindPart(8, H20)], EngineConfig(), st, started)


def test_the_bottleneck_is_read_off_the_critical_trajectory():
    """Not a fixed label: the term that dominates the trajectory ending nearest the batch's end."""
    got = predict_two_kinds([KindPart(8, H800), KindPart(8, H20)], EngineConfig(), _stats("search"), B)
    path = got.breakdown["critical_path"]
    assert set(path) == {"env", "decode", "prefill"} and got.bottleneck == max(path, key=path.get)


def test_a_weight_push_pauses_both_kinds_and_the_slower_sync_decides():
    st, tp2 = _stats("search"), H800.with_tp(2)
    parts = [KindPart(6, H800), KindPart(4, tp2)]
    base = predict_two_kinds(parts, EngineConfig(), st, B, share=0.6)
    pushed = predict_two_kinds(parts, EngineConfig(), st, BatchState(n_fresh=128, syncs=3), share=0.6)
    assert pushed.completion_s == pytest.approx(base.completion_s + 3 * H800.weight_sync_time(), rel=1e-9)
