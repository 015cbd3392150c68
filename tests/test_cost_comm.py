"""Collective cost models: the seed's worked example, ring/tree golden numbers, placement effects."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cost_models import comm as C
from frameworks import load_framework
from hardware_profiles import load_profile
from planner.catalog import get
from planner.estimate import estimate
from planner.parallel import ParallelConfig

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


MCORE_DEFAULT = (40e6, 1e6)
"""Megatron-Core's own bucket: max(40_000_000, 1_000_000 x dp) parameters
(megatron/core/distributed/distributed_data_parallel.py, core_r0.9.0 to core_r0.16.0)."""


def _bucket_step(framework: str, dp: int, v: int = 1, bucket=None):
    """The few fields of a cost_models.step.Step that gradient_buckets reads, gradients reduced in
    2 bytes; `bucket` replaces the profile's grad_bucket_params."""
    fw = load_framework(framework)
    if bucket is not None:
        fw = dataclasses.replace(fw, grad_bucket_params=bucket)
    interleaved = v > 1
    return SimpleNamespace(
        sw=SimpleNamespace(framework=fw, state_bytes=lambda precision: SimpleNamespace(reduce=2.0)),
        precision="amp-bf16",
        dp=np.asarray(float(dp)),
        v=np.asarray(float(v)),
        is_schedule=lambda name: np.asarray(name == "interleaved-1f1b" and interleaved),
    )


def test_gradient_buckets_follow_the_stacks_bucket_size():
    params = 7.8e9  # Nemotron-4 15B over tp 2
    grad_bytes = 2.0 * params
    buckets = lambda x: float(C.gradient_buckets(x, params))
    # NVIDIA's NeMo 2.0 / Megatron-Bridge recipes: bucket_size = 128 * 1024 * 1024 whenever dp > 1
    for dp in (8, 1024):
        assert buckets(_bucket_step("megatron", dp)) == np.ceil(params / 134_217_728)  # 59
    # Megatron-Core's default, one set of buckets per model chunk
    assert buckets(_bucket_step("megatron", 8, bucket=MCORE_DEFAULT)) == 195  # 40M each
    assert buckets(_bucket_step("megatron", 40, bucket=MCORE_DEFAULT)) == 195  # still the floor
    assert buckets(_bucket_step("megatron", 1024, bucket=MCORE_DEFAULT)) == 8  # 1.024B each
    assert buckets(_bucket_step("megatron", 1024, v=4, bucket=MCORE_DEFAULT)) == 2  # per chunk
    # PyTorch DDP: bucket_cap_mb = 25
    assert buckets(_bucket_step("fsdp", 1024)) == np.ceil(grad_bytes / (25 * 2**20))


def test_larger_buckets_expose_more_of_the_reduction_at_large_dp():
    model, hw = get("llama3-8b"), load_profile("dgx-h100")
    recipes = load_framework("megatron")
    mcore = dataclasses.replace(recipes, grad_bucket_params=MCORE_DEFAULT)

    def dp_comm(dp, fw):
        config = ParallelConfig(
            dp=dp, tp=1, pp=1, micro_batch=1, global_batch=4 * dp, seq=8192, framework="megatron"
        )
        kw = dict(gpus=dp, framework_profile=fw)
        return estimate(model, hw, config, **kw).time_breakdown_s()["dp_comm"]

    # at dp 8 both bucket sizes are small against the step; at dp 1,024 Megatron-Core's bucket is
    # 1.024B parameters, an eighth of the 8B model: the last bucket's reduction runs after the
    # backward and the forward waits for the first bucket's gather
    assert dp_comm(8, mcore) == pytest.approx(dp_comm(8, recipes), rel=0.3)
    assert dp_comm(1024, mcore) > 1.4 * dp_comm(1024, recipes)
