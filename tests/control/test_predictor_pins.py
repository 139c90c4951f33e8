"""Pins of pearl.control.predictor terms that the broader predictor tests do not move: the KV hand-off of a
disaggregated shape costs the cross-node rate when prefill and decode workers sit on different nodes."""
from __future__ import annotations

import pytest

from pearl.config import EngineConfig
from pearl.control.predictor import BatchState, WorkloadStats, predict_many
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape
from pearl.workloads import TrajectorySpec

Q8 = PerfModel(get_model("qwen3-8b"), get_hardware("h800"))
ENGINE = EngineConfig()

# Eight identical 4-turn trajectories, hand-off heavy (long prompt, observations and responses, little
# environment time), the responses long enough that fetching them back is a large share of the KV moved.
PROMPT, RESPONSE, OBSERVATION, TURNS = 6000, 2000, 1000, 4
SPECS = [TrajectorySpec(i, i, PROMPT, (RESPONSE,) * TURNS, (OBSERVATION,) * (TURNS - 1), (0.1,) * TURNS)
         for i in range(8)]
# KV moved per trajectory between its prefill and decode workers: every turn's prefilled tokens go to
# the decode worker (the prompt, then each observation + the token that closed the previous response),
# and every later turn first fetches the previous response's KV back to the prefill worker.
HANDOFF_TOKENS = PROMPT + (TURNS - 1) * (OBSERVATION + 1) + (TURNS - 1) * RESPONSE


def completion(shape: LayoutShape, devices_per_node: int) -> float:
    (p,) = predict_many([shape], [Q8], ENGINE, WorkloadStats.from_samples(SPECS), BatchState.from_specs(SPECS),
                        devices_per_node=devices_per_node, tol=1e-6)
    return p.completion_s


def test_cross_node_kv_handoff_slows_a_disaggregated_shape_by_the_transfer_time():
    shape = LayoutShape.disaggregated(1, 3)  # 4 tp-1 workers: one node of 8, or one node each
    same, cross = completion(shape, devices_per_node=8), completion(shape, devices_per_node=1)
    # Per hand-off the setup is paid either way; what changes is the bandwidth (NVLink vs the network).
    # Every trajectory is identical, so each finishes later by the same amount and so does the batch.
    extra = (Q8.kv_transfer_time(HANDOFF_TOKENS, same_node=False)
             - Q8.kv_transfer_time(HANDOFF_TOKENS, same_node=True))
    # 6000 + 3·1001 + 3·2000 = 15 003 tokens × 147 456 B = 2.212 GB: 88.5 ms at 25 GB/s, 5.5 ms at 400 GB/s
    assert extra == pytest.approx(15_003 * 147_456 * (1 / 25e9 - 1 / 400e9), rel=1e-9)
    assert cross > same
    assert cross - same == pytest.approx(extra, rel=0.2)
    # Two devices per node: the prefill worker shares its node with one of the three decode workers,
    # so a third of the hand-offs stay on the node and two thirds cross.
    half = completion(shape, devices_per_node=2)
    assert same < half < cross
    assert half - same == pytest.approx(2 / 3 * extra, rel=0.2)


def test_colocated_shape_ignores_the_node_size():
    # No hand-offs: a colocated worker prefills and decodes its own requests.
    shape = LayoutShape.colocated(4)
    assert completion(shape, devices_per_node=1) == completion(shape, devices_per_node=8)
