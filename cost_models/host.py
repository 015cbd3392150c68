"""Host time: what the host issues per operation and the fixed work of every step (issue 32).

Eager PyTorch issues each kernel from the host at `dispatch_us_per_op` (the profile's measured
dispatch + launch time per operator, benchmarks/calibrate.py); a kernel cannot start on the device
before the host has issued it. Where the stack synchronizes the host with the device, the host
cannot run ahead past that point, so the operation after it takes max(device, host) instead of
hiding the host time under earlier device work:

- Megatron-LM's pipeline sends (FrameworkProfile.pipeline_host_sync):
  `p2p_communication._communicate` runs the batched isend/irecv and, with `batch_p2p_comm` and
  `batch_p2p_sync` (both on by default; off only where the interleaved schedule overlaps its
  sends, `overlap_p2p_comm`), calls `torch.cuda.synchronize()` "to protect
  against race condition when using batch_isend_irecv()" (megatron/core/pipeline_parallel/
  p2p_communication.py); DeepSpeed's PipelineEngine reads each received activation's metadata on
  the host (`PartitionedTensor.from_meta`, runtime/pipe/engine.py _exec_recv_activations), so every
  blocking pipeline operation starts with the host and the device in step.
- the step's end: the gradient norm (`.item()` of the all-reduced norm, Megatron-Core
  optimizer/clip_grads.py get_grad_norm_fp32) and the loss read for logging synchronize every step,
  so the next step's host starts with an idle device.

Without a pipeline sync (one stage, or the interleaved schedule's overlapped sends) the host runs
ahead of the device through the whole step and only its total matters.

The per-step fixed work after the gradient reduction (where the optimizer step is): the optimizer's
multi-tensor launches, the gradient norm's multi-tensor L2 kernels and its one-float all-reduce, and
the loss all-reduce for logging (all latency-bound collectives: comm.group_collective_seconds).
"""

from __future__ import annotations

import numpy as np

from cost_models import moe as MO
from cost_models.comm import group_collective_seconds
from cost_models.compute import dispatch_seconds, memory_bound_seconds, recompute_passes

BACKWARD_LAUNCHES_PER_FORWARD = 2.0
"""Kernels the backward launches per forward kernel: each operator's backward computes its input's
gradient and, for a weight, the weight's (Narayanan et al. 2021, Sec. 5.1: backward = 2 forward for
the GEMMs; autograd runs one backward node per forward node, with two outputs for weighted ops)."""

MULTI_TENSOR_CHUNK_ELEMENTS = 2048 * 32
"""Elements per block of a multi-tensor apply kernel (apex/Transformer Engine multi_tensor_applier,
chunk_size 2048 * 32 as Megatron-Core passes it, megatron/core/optimizer)."""
MULTI_TENSOR_BLOCKS_PER_LAUNCH = 320
"""Chunks one multi-tensor launch processes (apex csrc/multi_tensor_apply.cuh,
depth_to_max_blocks = 320 for every depth; PyTorch's fused and foreach optimizers use the same
limits, aten/src/ATen/native/cuda/MultiTensorApply.cuh)."""
MULTI_TENSOR_TENSORS_PER_LAUNCH = {1: 110, 4: 36, 5: 30}
"""Tensors one multi-tensor launch takes, by the lists it walks (apex csrc/multi_tensor_apply.cuh,
depth_to_max_tensors = {110, 64, 48, 36, 30}): the L2 norm walks the gradients (depth 1), Adam the
gradients, parameters and two moments (4), with an fp32 master copy 5."""
NORM_BYTES = 4.0
"""The gradient norm's all-reduced value: one fp32 (Megatron-Core clip_grads.get_grad_norm_fp32)."""
LOSS_BYTES = 4.0
"""The loss averaged over the data-parallel ranks for logging: one fp32 per step (Megatron-Core
training.py train_step, the reduced losses of the step's micro-batches)."""


def collective_launches_fwd(x):
    """NCCL calls of one block's forward on its tensor-parallel group: Megatron's g operator after
    attention and after the MLP (one all-reduce each, Shoeybi et al. 2019, Sec. 3), with sequence
    parallelism an all-gather before and a reduce-scatter after each (Korthikanti et al. 2022,
    Sec. 4.2.2); none with tp = 1."""
    return np.where(x.tp > 1, 2.0 * np.where(x.sp, 2.0, 1.0), 0.0)


def block_host_parts(x) -> tuple:
    """(forward, backward, one recomputed forward) host time of one block and one micro-batch: the
    block table's kernels plus its tensor-parallel NCCL calls, forward once, backward
    BACKWARD_LAUNCHES_PER_FORWARD times, at dispatch_us_per_op; a recomputed forward again per
    recompute pass (recompute_passes). With CUDA graphs (Software.cuda_graphs: Megatron-Core's
    per-layer graphs capture each TransformerLayer's forward and backward,
    megatron/core/transformer/cuda_graphs.py) a pass is one graph launch. Where dropless MoE
    layers wait on the host (moe.layers_sync_host) the forwards, recomputed ones too, are issued
    in step with the device and moe.host_sync_seconds costs them: 0 here."""
    if x.sw.cuda_graphs:
        one = dispatch_seconds(np.ones_like(x.dp), x.hw)
        fwd, bwd = one, one
    else:
        fwd = dispatch_seconds(x.table.kernels_fwd + collective_launches_fwd(x), x.hw)
        bwd = BACKWARD_LAUNCHES_PER_FORWARD * fwd
    if MO.layers_sync_host(x):  # each forward is issued in step: moe.host_sync_seconds costs it
        return 0.0 * fwd, bwd, 0.0 * fwd
    return fwd, bwd, fwd * recompute_passes(x)


def block_host_seconds(x) -> tuple:
    """(forward, backward with the busiest rank's share of recomputation) host time of one block and
    one micro-batch (block_host_parts)."""
    fwd, bwd, recomputed = block_host_parts(x)
    return fwd, bwd + x.full_share * recomputed


METRIC_LAUNCHES = 7
"""Kernels one train metric launches per micro-batch, outside autograd (Composer's
LanguageCrossEntropy.update under autocast): the fp32 cast of the logits, log_softmax, nll_loss
(summed in its kernel), the mask of counted targets (`target != ignore_index`) and its sum, and the
two running sums' adds (`total_items`, `sum_loss`); without autocast there is no cast, one launch
fewer, left in the count."""


def head_host_seconds(x):
    """Host time of the head's forward and backward for one micro-batch (the head table's kernels,
    forward and backward; not captured by per-layer graphs), and of the trainer's train metrics
    (METRIC_LAUNCHES each, forward only)."""
    head = dispatch_seconds(x.head.kernels, x.hw) * (1.0 + BACKWARD_LAUNCHES_PER_FORWARD)
    return head + dispatch_seconds(METRIC_LAUNCHES * x.sw.train_metrics, x.hw)


def host_synced(x):
    """Per candidate, whether the host waits for the device before every pipeline operation: a
    blocking pipeline of a stack that synchronizes there (FrameworkProfile.pipeline_host_sync;
    module docstring), i.e. pp > 1 unless the interleaved schedule overlaps its sends
    (Software.overlap_p2p). torch.distributed.pipelining waits on the stream only."""
    overlapped = x.is_schedule("interleaved-1f1b") & (x.v > 1) & x.sw.overlap_p2p
    return (x.pp > 1) & ~overlapped & bool(x.sw.framework.pipeline_host_sync)


def rank_host_seconds(x, *, last: bool) -> tuple:
    """(forward, backward) host time of one micro-batch on the busiest rank: its blocks'
    (block_host_seconds) and, on the last rank, the head's (split as its device time,
    cost_models.timeline.HEAD_FORWARD_SHARE: one of its three GEMMs in the forward)."""
    h_f, h_b = block_host_seconds(x)
    h_head = np.where(last, head_host_seconds(x), 0.0)
    return x.blocks_most * h_f + h_head / 3.0, x.blocks_most * h_b + 2.0 * h_head / 3.0


def host_wait_seconds(x, *, fwd_s, bwd_s, last):
    """Time the busiest rank's compute stream waits for its host, closed form, from one
    micro-batch's forward and backward on that rank, device `fwd_s`, `bwd_s` and host H_f, H_b
    (rank_host_seconds; `last`: whether the rank holds the head). With a host sync before every
    pipeline operation (host_synced) each operation takes max(device, host):
        m (max(0, H_f - D_f) + max(0, H_b - D_b)).
    Without one the host runs ahead from the step's start and operation j ends at
    max(end_{j-1} + D_j, H_1 + .. + H_j), so the stream ends at max over j of (the host's total up
    to j + the device time after j); with m equal forward-backward pairs the largest is at the
    first forward or at the last backward:
        max(0, H_f - D_f, m (H_f + H_b - D_f - D_b) + max(0, D_b - H_b)).
    (cost_models.timeline runs the same rule operation by operation.)"""
    h_f, h_b = rank_host_seconds(x, last=last)
    synced = x.m * (np.maximum(0.0, h_f - fwd_s) + np.maximum(0.0, h_b - bwd_s))
    ahead = np.maximum(
        np.maximum(0.0, h_f - fwd_s),
        x.m * (h_f + h_b - fwd_s - bwd_s) + np.maximum(0.0, bwd_s - h_b),
    )
    return np.where(host_synced(x), synced, ahead)


def forward_share(x, *, fwd_s, bwd_s, last):
    """Share of the busiest rank's compute stream (device and host waits) its forwards take, each
    operation as max(device, host) (host_wait_seconds' synchronized rule; where the host runs ahead
    the same shares split the stream's end): the windows activation offload copies hide in."""
    h_f, h_b = rank_host_seconds(x, last=last)
    f, b = np.maximum(fwd_s, h_f), np.maximum(bwd_s, h_b)
    return f / np.maximum(f + b, 1e-30)


def multi_tensor_launches(elements, tensors, depth: int):
    """Launches of one multi-tensor apply over `tensors` tensors of `elements` in all: a launch
    takes at most MULTI_TENSOR_BLOCKS_PER_LAUNCH chunks of MULTI_TENSOR_CHUNK_ELEMENTS and
    MULTI_TENSOR_TENSORS_PER_LAUNCH[depth] tensors (apex multi_tensor_apply.cuh), every tensor's
    last chunk partial."""
    chunks = np.ceil(np.asarray(elements, float) / MULTI_TENSOR_CHUNK_ELEMENTS) + tensors
    return np.maximum(
        np.ceil(chunks / MULTI_TENSOR_BLOCKS_PER_LAUNCH),
        np.ceil(np.asarray(tensors, float) / MULTI_TENSOR_TENSORS_PER_LAUNCH[depth]),
    )


def tensors_per_block(spec) -> float:
    """Parameter tensors of one block: the norms (a weight, and a bias for LayerNorm) and the four
    linear layers (QKV, output, MLP in and out; Transformer Engine fuses gate and up) with their
    biases where the model has them."""
    norm = spec.norms_per_block * (2.0 if spec.norm == "layernorm" else 1.0)
    biases = float(spec.qkv_bias) + float(spec.out_bias) + 2.0 * float(spec.mlp_bias)
    return norm + 4.0 + biases


def optimizer_with_host_seconds(x, optimizer_s, params_updated, blocks):
    """The optimizer step with the per-step work around it (module docstring), seconds: the
    gradient norm (its multi-tensor L2 kernels, depth 1, reading the rank's gradients, and its
    one-float all-reduce over every rank: Megatron-Core's distributed optimizer reduces gradient
    statistics over the whole world, DistributedOptimizer.get_grad_stats_parallel_group), then,
    after the norm's host sync, the optimizer's multi-tensor Adam launches (depth 4, 5 with a
    master copy) beside its streaming `optimizer_s` (the device runs each launch as the host
    issues it: max(device, host)), and the loss's all-reduce over the data-parallel group for
    logging (latency-bound collectives: comm.group_collective_seconds).
    `params_updated`: the elements the rank updates, over its `blocks` blocks' tensors (ZeRO >= 1
    shards them over dp)."""
    tensors = np.maximum(1.0, blocks * tensors_per_block(x.spec) / np.where(x.zero >= 1, x.dp, 1))
    states = x.sw.state_bytes(x.precision)
    depth = 5 if states.master else 4
    norm_host = dispatch_seconds(multi_tensor_launches(params_updated, tensors, 1) + 1.0, x.hw)
    norm_device = memory_bound_seconds(params_updated * states.grad, x.hw)
    adam_host = dispatch_seconds(multi_tensor_launches(params_updated, tensors, depth), x.hw)
    world = x.dp * x.tp * x.pp * x.cp
    in_node = np.minimum(world, float(x.hw.devices_per_node))
    norm = group_collective_seconds("allreduce", NORM_BYTES, world, in_node, x.hw)
    # the densest layout of the data-parallel ranks: no placement's is faster, and the search scores
    # the optimizer step once per skeleton, placements apart (planner.search)
    loss = group_collective_seconds(
        "allreduce", LOSS_BYTES, x.dp, np.minimum(x.dp, float(x.hw.devices_per_node)), x.hw
    )
    return (
        np.maximum(norm_host, norm_device)
        + norm
        + np.maximum(optimizer_s, adam_host)
        + loss
        + dispatch_seconds(1.0, x.hw)
    )
