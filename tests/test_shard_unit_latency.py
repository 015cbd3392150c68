"""FSDP's per-block collectives' ring latency (cost_models.comm.shard_unit_latency_seconds)."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import comm as C
from frameworks import load_framework
from hardware_profiles import load_profile
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.sources import resolve_model

HW = load_profile("dgx-a100-80g")
SPEC = resolve_model("llama2-7b")
FSDP = dataclasses.replace(load_framework("fsdp"), shard_per_block=True)
A_IN, A_OUT = HW.intra_node_latency_us * 1e-6, HW.inter_node_latency_us * 1e-6


def run(gpus=32, zero=3, framework=FSDP, **kw):
    cfg = dict(dp=gpus, tp=1, pp=1, micro_batch=1, global_batch=2 * gpus, seq=2048)
    cfg.update(zero=zero, precision="amp-bf16", framework="fsdp", **kw)
    return estimate(SPEC, HW, ParallelConfig(**cfg), gpus=gpus, framework_profile=framework)


def unit_s(est) -> float:
    return float(C.shard_unit_latency_seconds(est.scores.step)[0])


def test_ring_latency_counts_every_rank_as_a_step():
    # NCCL's ring: n - 1 steps, nodes - 1 of them over the network
    assert float(C.ring_latency_seconds(1, 1, HW)) == 0.0
    assert float(C.ring_latency_seconds(8, 8, HW)) == pytest.approx(7 * A_IN)
    assert float(C.ring_latency_seconds(16, 8, HW)) == pytest.approx(14 * A_IN + A_OUT)
    assert float(C.ring_latency_seconds(128, 8, HW)) == pytest.approx(112 * A_IN + 15 * A_OUT)


def test_latency_counts_three_collectives_per_block_and_micro_batch():
    est = run()
    step = est.scores.step
    blocks, m = float(step.blocks_most[0]), float(step.m[0])
    ring = float(C.ring_latency_seconds(32, 8, HW))
    assert unit_s(est) == pytest.approx(m * (3 * blocks + C.SHARD_ROOT_COLLECTIVES) * ring)


def test_latency_grows_with_the_shard_group_and_zero3_gathers_twice():
    assert unit_s(run(gpus=8)) < unit_s(run(gpus=32)) < unit_s(run(gpus=128))
    assert unit_s(run(zero=2)) < unit_s(run(zero=3))


def test_no_latency_without_sharding_or_per_block_collectives():
    assert unit_s(run(zero=0)) == 0.0
    bucketed = dataclasses.replace(FSDP, shard_per_block=False)
    assert unit_s(run(framework=bucketed)) == 0.0


def test_the_step_waits_for_it():
    bucketed = dataclasses.replace(FSDP, shard_per_block=False)
    with_it, without = run(), run(framework=bucketed)
    assert with_it.step_time_s - without.step_time_s == pytest.approx(unit_s(with_it), rel=1e-6)


def test_hybrid_sharding_adds_one_all_reduce_over_the_replicas_per_block():
    """HSDP (HYBRID_SHARD): shard groups of one node, the 4 replicas one per node. Per block and
    micro-batch, besides the three ring collectives inside the node, the reduced shard is
    all-reduced over the replicas; for the latency NCCL's tree wins, 2 log2(4) network steps
    against the ring's 2 (4 - 1) (Sanders et al. 2009 double binary tree, as cost_models.comm
    models NCCL)."""
    est = run(gpus=32, dp_shard=8)
    step = est.scores.step
    blocks, m = float(step.blocks_most[0]), float(step.m[0])
    inside = 7 * A_IN  # a ring over the node's 8 ranks
    across = 2 * 2 * A_OUT  # tree all-reduce over 4 nodes
    expected = m * ((3 * blocks + C.SHARD_ROOT_COLLECTIVES) * inside + (blocks + 1) * across)
    assert unit_s(est) == pytest.approx(expected)


def test_hybrid_shard_groups_spanning_two_nodes_pay_one_network_step_per_ring():
    est = run(gpus=32, dp_shard=16)
    step = est.scores.step
    blocks, m = float(step.blocks_most[0]), float(step.m[0])
    inside = 14 * A_IN + A_OUT  # 16 ranks on 2 nodes: 15 ring steps, one over the network
    across = 2 * A_OUT  # 2 replicas: ring and tree both take 2 network steps
    expected = m * ((3 * blocks + C.SHARD_ROOT_COLLECTIVES) * inside + (blocks + 1) * across)
    assert unit_s(est) == pytest.approx(expected)
