"""Collective cost models: the seed's worked example, ring/tree golden numbers, placement effects."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cost_models import comm as C
from hardware_profiles import load_profile

HW = load_profile("dgx-a100-80g")


def test_seed_worked_example_16_nodes_of_8():
    # "Latent Space": all-reduce over n nodes costs log2(n) steps -> 1/2 + 1/2 * 1/log2(16) = 0.625
    assert float(C.relative_allreduce_cost(16, 8)) == pytest.approx(0.625, rel=1e-12)
    assert float(C.relative_allreduce_cost(1, 8)) == 1.0


def test_ring_allreduce_matches_nccl_tests_busbw_definition():
    # nccl-tests: busbw = algbw * 2 (n-1)/n  ->  t = 2 (n-1)/n * S / busbw (+ latency)
    size, n, bw = 1e9, 8, 200e9
    t = float(C.ring_allreduce_seconds(size, n, bw, 0.0))
    assert t == pytest.approx(2 * 7 / 8 * size / bw, rel=1e-12)
    assert float(C.ring_allreduce_seconds(size, 1, bw, 1e-5)) == 0.0
    # tree: same bandwidth term, log2(n) latency: better for tiny messages
    assert float(C.allreduce_seconds(8, 64, bw, 1e-5)) < float(
        C.ring_allreduce_seconds(8, 64, bw, 1e-5)
    )


def test_reduce_scatter_plus_allgather_equals_allreduce_bandwidth():
    size, n, bw = 4e8, 8, 150e9
    rs = float(C.reduce_scatter_seconds(size, n, bw, 0.0))
    ag = float(C.allgather_seconds(size, n, bw, 0.0))
    assert rs + ag == pytest.approx(float(C.ring_allreduce_seconds(size, n, bw, 0.0)), rel=1e-12)


def test_group_inside_a_node_is_faster_than_across_nodes():
    inside = float(C.group_collective_seconds("allreduce", 1e9, 8, 8, HW))
    spread = float(C.group_collective_seconds("allreduce", 1e9, 8, 1, HW))
    hier = float(C.group_collective_seconds("allreduce", 1e9, 16, 8, HW))
    assert inside < hier < spread * 2
    assert inside < spread


@settings(max_examples=40, deadline=None)
@given(
    size=st.floats(1e3, 1e10),
    n=st.sampled_from([2, 4, 8, 16, 64, 256]),
    local=st.sampled_from([1, 2, 4, 8]),
    factor=st.floats(1.0, 10.0),
    which=st.sampled_from(["intra_node_GBps_per_device", "inter_node_Gbps_per_node"]),
)
def test_more_bandwidth_is_never_slower(size, n, local, factor, which):
    faster = dataclasses.replace(HW, **{which: getattr(HW, which) * factor})
    for kind in ("allreduce", "reduce_scatter", "allgather"):
        slow = C.group_collective_seconds(kind, size, n, min(local, n), HW)
        fast = C.group_collective_seconds(kind, size, n, min(local, n), faster)
        assert np.all(fast <= slow * (1 + 1e-12))
