"""Host issue on the step (cost_models.host, cost_models.timeline; issue 32): each operation's
kernels are issued by the host at the profile's dispatch rate, the host waits for the device where
the stack synchronizes, small collectives are latency-bound, and the step carries its fixed
per-step work."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cost_models import comm as C
from cost_models import compute as K
from cost_models import host as H
from cost_models import moe as MO
from cost_models.timeline import RankWork, StepWork, simulate
from typer.testing import CliRunner

from planner import estimate as E
from planner.cli import app
from planner.exports import export_plan
from planner.plan import plan_from_document
from planner.parallel import ParallelConfig
from planner.run_options import RunOptions
from hardware_profiles import load_profile

ROOT = Path(__file__).resolve().parents[1]
A100 = json.loads((ROOT / "hardware_profiles" / "dgx-a100-80g.json").read_text())
DISPATCH_S = A100["efficiency"]["dispatch_us_per_op"] * 1e-6
"""The measured host time per operator (benchmarks/calibrate.py), from the profile's data."""
ALPHA_IN_S = A100["intra_node_latency_us"] * 1e-6
ALPHA_OUT_S = A100["inter_node_latency_us"] * 1e-6

LEGACY_LAYER_OPS = 16 * 2
"""Host operators of one forward of legacy Megatron's ParallelTransformerLayer, which
Megatron-DeepSpeed runs (frameworks/deepspeed.json megatron_legacy_layer), here with the stack's
flash attention and no dropout: 9 kernels outside the attention core (two norms, four matmuls,
bias-GeLU, two bias-dropout-adds), the QKV and fc2 bias adds, and the flash core's five (three
q, k, v copies, the kernel, the output copy; cost_models.blocks.legacy_megatron_launches), two
host operators each as eager module code is counted."""
TP_CALLS_FWD = 2
"""Megatron's g operator: an all-reduce after attention and after the MLP (Shoeybi et al. 2019)."""
BACKWARD_PER_FORWARD = 2
"""Each operator's backward: the input's and the weight's gradient."""


def test_a_small_model_on_one_a100_node_is_host_bound_per_layer():
    """GPT-2 medium (24 layers) with tp 2 and one-sequence micro-batches on 8 A100s, Megatron-
    DeepSpeed: a layer's forward + backward takes the host (32 + 2) x 3 operators x 23.7 us =
    2.42 ms per micro-batch, more than its GPU work, so the compute stream runs at the host's
    pace."""
    cfg = ParallelConfig(
        dp=4, tp=2, pp=1, micro_batch=1, global_batch=32, seq=1024, framework="deepspeed"
    )
    est = E.estimate("gpt2-medium", "dgx-a100-80g", cfg, gpus=8)
    rank = est.scores.timeline.ranks[0]
    m, layers = 8, 24
    host_per_layer = DISPATCH_S * (LEGACY_LAYER_OPS + TP_CALLS_FWD) * (1 + BACKWARD_PER_FORWARD)
    stream_per_layer = rank.compute_end_s / (m * layers)
    # the head's launches add a little to the 24 layers'
    assert host_per_layer <= stream_per_layer <= 1.05 * host_per_layer
    assert rank.busy_s / (m * layers) < 0.8 * host_per_layer  # the GPU work is less
    assert est.time_breakdown_s()["host_wait"] > 0.2 * est.step_time_s


def test_blocking_pipeline_runs_each_operation_at_max_of_device_and_host():
    """Megatron's batched p2p synchronizes the device before each pipeline operation: 1F1B's step is
    (m + p - 1) (max(F, H_F) + max(B, H_B)) (Narayanan et al. 2021, eq. 1, with each slot the longer
    of the device and the host)."""
    p, m = 4, 8
    ranks = tuple(RankWork(fwd_s=1.0, bwd_s=2.0, fwd_host_s=1.5, bwd_host_s=1.0) for _ in range(p))
    tl = simulate(
        StepWork(schedule="1f1b", microbatches=m, chunks=1, ranks=ranks, host_synced=True)
    )
    assert tl.makespan_s == pytest.approx((m + p - 1) * (1.5 + 2.0))
    assert tl.ranks[0].host_wait_s == pytest.approx(m * 0.5)


def test_a_host_running_ahead_hides_under_later_device_work():
    """One stage, no sync inside the step: operation j ends at max(end_{j-1} + D_j, H_1 + .. + H_j).
    F = 1, B = 2, H_F = 2, H_B = 1, 4 micro-batches: the forwards wait for the host, the backwards
    catch up, the stream ends at 13 (by hand: 2, 4, 5, 7, 8, 10, 11, 13)."""
    ranks = (RankWork(fwd_s=1.0, bwd_s=2.0, fwd_host_s=2.0, bwd_host_s=1.0),)
    tl = simulate(StepWork(schedule="1f1b", microbatches=4, chunks=1, ranks=ranks))
    ends = [op.end_s for op in tl.ops]
    assert ends == pytest.approx([2, 4, 5, 7, 8, 10, 11, 13])
    assert tl.makespan_s == pytest.approx(13.0)
    assert tl.ranks[0].busy_s == pytest.approx(12.0)


def test_small_tensor_parallel_all_reduce_is_latency_bound():
    """A 16 KiB all-reduce over 8 NVLink ranks costs its latency, 2 log2(8) alpha (NCCL's tree,
    faster than the ring's 2 (n - 1) alpha), the bytes well under a microsecond; across 2 nodes the
    network's steps add 2 log2(2) alpha_net."""
    hw = load_profile("dgx-a100-80g")
    inside = float(C.group_collective_seconds("allreduce", 16384, 8, 8, hw))
    assert 2 * 3 * ALPHA_IN_S <= inside <= 2 * 3 * ALPHA_IN_S + 1e-6
    across = float(C.group_collective_seconds("allreduce", 16384, 16, 8, hw))
    assert across == pytest.approx(inside + 2 * 1 * ALPHA_OUT_S, abs=1e-6)


def test_multi_tensor_launches_follow_apex_limits():
    """apex multi_tensor_apply: 65,536-element chunks, at most 320 per launch and 36 tensors at
    depth 4: 1e9 elements in 100 tensors are ceil((ceil(1e9 / 65536) + 100) / 320) = 48
    launches; 1,000 small tensors ceil(1000 / 36) = 28."""
    assert float(H.multi_tensor_launches(1e9, 100, 4)) == math.ceil(
        (math.ceil(1e9 / 65536) + 100) / 320
    )
    assert float(H.multi_tensor_launches(1000 * 64, 1000, 4)) == math.ceil(1000 / 36)


def test_step_carries_the_gradient_norm_and_loss_all_reduces():
    """64 GPUs on 8 nodes, Megatron-Core's distributed optimizer: the gradient norm's all-reduce
    over every rank (2 log2(8) alpha in the node, 2 log2(8) alpha_net across) and the loss's over
    dp are in the optimizer's term, after the reductions, with the launches of the norm and the
    step."""
    cfg = ParallelConfig(dp=8, tp=8, pp=1, micro_batch=1, global_batch=64, seq=2048, zero=1)
    est = E.estimate("llama3-8b", "dgx-a100-80g", cfg, gpus=64)
    x = est.scores.step
    params = MO.rank_params(x, x.blocks_first, True, True)
    device_only = float(K.optimizer_step_seconds(x, params)[0])
    norm = 2 * 3 * ALPHA_IN_S + 2 * 3 * ALPHA_OUT_S
    assert est.time_breakdown_s()["optimizer"] >= device_only + norm


def test_cuda_graphs_issue_a_block_pass_as_one_launch():
    """With per-layer CUDA graphs (Megatron-Core --enable-cuda-graph) the host issues one graph per
    block pass instead of its 16 launches: the host-bound small model runs at its GPU's pace."""
    cfg = ParallelConfig(dp=4, tp=2, pp=1, micro_batch=1, global_batch=32, seq=1024)
    eager = E.estimate("gpt2-medium", "dgx-a100-80g", cfg, gpus=8)
    graphs = E.estimate(
        "gpt2-medium", "dgx-a100-80g", cfg, gpus=8, options=RunOptions(cuda_graphs=True)
    )
    assert graphs.step_time_s < 0.8 * eager.step_time_s
    x = graphs.scores.step
    fwd, bwd = H.block_host_seconds(x)
    assert np.allclose([float(fwd[0]), float(bwd[0])], [DISPATCH_S, DISPATCH_S])


@pytest.mark.parametrize(
    "framework,schedule,v,synced",
    [
        ("megatron", "1f1b", 1, True),  # batch_p2p_sync: torch.cuda.synchronize() per exchange
        ("megatron", "interleaved-1f1b", 2, False),  # overlap_p2p_comm: no batched sync
        ("deepspeed", "1f1b", 1, True),  # PipelineEngine reads received metadata on the host
        ("torchtitan", "1f1b", 1, False),  # torch.distributed.pipelining waits on the stream
    ],
)
def test_which_pipelines_hold_the_host_to_the_device(framework, schedule, v, synced):
    cfg = ParallelConfig(
        dp=1,
        tp=1,
        pp=4,
        micro_batch=1,
        global_batch=16,
        seq=1024,
        schedule=schedule,
        virtual_stages=v,
        framework=framework,
    )
    est = E.estimate("gpt2-medium", "dgx-a100-80g", cfg, gpus=4)
    assert bool(H.host_synced(est.scores.step)[0]) is synced


CLI = ["estimate", "megatron-1.7b", "--hardware", "dgx-a100-80g", "--gpus", "8", "--tp", "8"]
CLI += ["--global-batch", "8", "--seq", "512", "--json"]


def test_cuda_graphs_reach_the_plan_and_the_megatron_export():
    """--cuda-graphs on estimate: the plan's software block says so, its host wait is gone, and the
    Megatron-LM export carries --enable-cuda-graph (megatron/training/arguments.py)."""
    res = CliRunner().invoke(app, [*CLI, "--cuda-graphs", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["software"]["cuda_graphs"] is True
    assert (
        doc["prediction"]["time_breakdown_s"]["host_wait"] < 0.01 * doc["prediction"]["step_time_s"]
    )
    assert "--enable-cuda-graph" in export_plan(plan_from_document(doc), "megatron").text


def test_cuda_graphs_on_a_stack_without_them_is_one_line_and_exit_2():
    res = CliRunner().invoke(app, [*CLI, "--framework", "fsdp", "--cuda-graphs"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and res.stdout == "" and len(lines) == 1, res.output
    assert "cuda_graphs" in lines[0] and "fsdp" in lines[0]
