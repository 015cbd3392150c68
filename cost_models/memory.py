"""Memory per rank at its peak (torch.cuda.max_memory_allocated semantics), numbers or numpy arrays.

Model states per parameter (bytes), by precision and implementation:

    eager amp (PyTorch autocast): fp32 params 4 + fp32 grads 4 + Adam m, v 8 = 16, plus the
        autocast cache of bf16 copies of every GEMM weight (2 bytes each) during the forward;
    megatron amp fp16 (Megatron's theoretical_memory_usage.py): 2-byte params + 4-byte main
        grads + fp32 master, m, v 12 = 18; bf16 and FP8 keep bf16 gradients, as NVIDIA's recipes
        do (frameworks/megatron.json; --grad-reduce-dtype fp32: 18);
    fp32: 4 + 4 + 8 = 16;  pure bf16 (states in bf16, as torch.optim.AdamW keeps them): 2 + 2 + 4 = 8.
    SGD with momentum keeps one state instead of two.

ZeRO (Rajbhandari et al. 2020, Sec. 5): stage 1 shards the optimizer states over dp, stage 2 also
the gradients, stage 3 also the parameters (plus the gathered parameters of the block in use and
the one prefetched).

The peak is the largest of three moments of a step (each a sum over what is alive then):
  forward end     states (+ grads when they persist: grad accumulation, Megatron's grad buffer)
                  + autocast weight cache + saved activations + logits of the forward;
  backward start  as above with the loss's backward transient (logits peak);
  backward end    states + all grads + the transient of the last gradient (the tied embedding's
                  dense gradient, V h) or, after it, of the trainer's train metrics over the
                  logits (blocks.metric_transient) — the peak of small-activation runs.
Plus the framework's workspaces (cuBLAS: one per stream that runs GEMMs, forward and autograd
threads), which the caching allocator counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models import blocks as B
from cost_models import moe as MO
from cost_models import params as P
from cost_models.activations import kept_per_token
from cost_models.blocks import FP8_BYTES, quantized_bytes
from cost_models.comm import tp_overlapped
from cost_models.offload import host_memory_bytes_per_node, offloaded_share
from cost_models.pipeline import inflight_microbatches, inflight_microbatches_last_stage
from hardware_profiles.efficiency import efficiency
from planner.parallel import SCHEDULES


def state_bytes_per_param(software, precision: str, optimizer: str) -> tuple[float, float, float]:
    """(params, grads, optimizer states) bytes per parameter: the framework profile's table with the
    run's gradient dtype (cost_models.step.Software.states, frameworks.FrameworkProfile.states; module
    docstring). The one owner: memory, the stage partitioner, offload and goodput call this. Takes a
    Software or a bare FrameworkProfile (its defaults)."""
    return software.states(precision, optimizer)


def zero_sharded(bytes_, dp, zero, from_stage: int):
    """Bytes on one rank when ZeRO stage >= `from_stage` shards them over dp."""
    return np.where(np.asarray(zero) >= from_stage, bytes_ / np.asarray(dp, dtype=float), bytes_)


def grads_persist(policy: str, num_microbatches):
    """Whether gradients exist during the forward: 'always' with a contiguous grad buffer (Megatron),
    'accumulating': only when micro-batches accumulate into them (set_to_none zero_grad frees them)."""
    m = np.asarray(num_microbatches, dtype=float)
    return np.ones_like(m, dtype=bool) if policy == "always" else m > 1


@dataclass(frozen=True, kw_only=True, slots=True)
class ResidentBytes:
    """What one rank holds at the step's three high-water moments (end of the forward, start of the
    backward, end of the backward), each field an array over candidates."""

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    grads_present: np.ndarray
    """Whether gradients exist during the forward (grads_persist)."""
    cache_fwd: np.ndarray
    """autocast's 16-bit weight casts held through the forward."""
    cache_bwd: np.ndarray
    activations: np.ndarray
    logits_fwd_end: np.ndarray
    logits_peak: np.ndarray
    last_grad_transient: np.ndarray
    metric_transient: np.ndarray | float
    """The train metrics' logits and fp32 copies after each backward (blocks.metric_transient)."""
    recompute_transient: np.ndarray
    workspace: np.ndarray | float
    """Held at every moment: the framework's workspace and the overlap's userbuffers."""

    def peak(self):
        """Largest of the three moments; returns (peak, activations term, other term) of that
        moment."""
        states = self.params + self.optimizer
        g_fwd = np.where(self.grads_present, self.grads, 0.0)
        fwd_end = (
            states
            + g_fwd
            + self.cache_fwd
            + self.activations
            + self.logits_fwd_end
            + self.workspace
        )
        bwd_start = (
            states
            + g_fwd
            + self.cache_bwd
            + self.activations
            + np.maximum(self.logits_peak, self.recompute_transient)
            + self.workspace
        )
        transient = np.maximum(self.last_grad_transient, self.metric_transient)
        bwd_end = states + self.grads + transient + self.workspace
        peak = np.maximum(np.maximum(fwd_end, bwd_start), bwd_end)
        acts = np.where(peak == bwd_end, 0.0, self.activations)
        other = peak - states - np.where(peak == bwd_end, self.grads, g_fwd) - acts
        return peak, acts, other


def cuda_context_bytes(hw) -> float:
    """CUDA context, kernels and library handles outside the caching allocator (efficiency key)."""
    return efficiency(hw, "cuda_context_bytes")


# ------------------------------------------------------------------------ step terms (cost_models.step)


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationBytes:
    """Saved-for-backward bytes of one micro-batch on one rank (cost_models.blocks tables)."""

    block: np.ndarray
    """One block under the candidate's recomputation (none / selective / full)."""
    block_no_recompute: np.ndarray
    """One block with everything kept: the working set while a recomputed block re-runs."""
    embedding: np.ndarray
    head: np.ndarray
    head_inflight: np.ndarray
    """Micro-batches whose head activations the last rank holds (1F1B family 1, GPipe m)."""


def activation_bytes(x) -> ActivationBytes:
    """Korthikanti et al. 2022, Sec. 4-5 as generalized in cost_models.blocks: per token, replicated
    terms / (tp with SP) + sharded terms / tp + scores s / tp, times b s tokens; selective recompute
    drops the attention scores (or keeps torchtitan's per-operator set, Step.sac), full keeps the block
    input only."""
    full_block, selective, full = kept_per_token(x.table, x.per_token, x.sac)
    kept = np.select([x.full, x.selective], [full, selective], full_block)
    return ActivationBytes(
        block=kept * x.tokens,
        block_no_recompute=full_block * x.tokens,
        embedding=x.per_token(B.embedding_saved(x.spec, x.precision, dropout=x.sw.dropout))
        * x.tokens,
        head=x.per_token(x.head.saved) * x.tokens,
        head_inflight=np.where(
            x.single_stage, 1.0, inflight_microbatches_last_stage(x.schedule, x.m, SCHEDULES)
        ),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class RankMemory:
    """Bytes of one pipeline rank at its peak moment, split by kind (the plan document's memory terms)."""

    peak: np.ndarray
    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    """Activations counted in the peak (0 when the peak is the end of the backward)."""
    other: np.ndarray
    saved: np.ndarray
    """Activations held at the end of the forward, whatever moment the peak is (what `planner profile`
    reports for one micro-batch with nothing in flight)."""

    def higher(self, other: "RankMemory", where=True) -> "RankMemory":
        """Per candidate, the rank whose peak is higher (all its terms)."""
        pick = where & (other.peak > self.peak)
        return RankMemory(
            **{
                f: np.where(pick, getattr(other, f), getattr(self, f))
                for f in ("peak", "params", "grads", "optimizer", "activations", "other", "saved")
            }
        )


def zero3_live_params(x, n_blocks, dp, edp):
    """Parameters a ZeRO-3 rank holds gathered beyond its own shard at once (Rajbhandari et al. 2020, Sec. 5.3:
    parameters are all-gathered just before use and freed after). By wrapped unit (FSDP's fully_shard per
    block, torchtitan / plain PyTorch; FrameworkProfile.zero3_max_live_params None): the block in use and the
    one prefetched. By module (DeepSpeed: PartitionedParameterCoordinator.fetch_sub_module gathers one module's
    own parameters and prefetches more only while fewer than stage3_max_live_parameters, default 1e9, are
    available; deepspeed/runtime/zero/partitioned_param_coordinator.py and constants.py, v0.6): at most that
    many, or the largest module (params.largest_module_params / tp) when it is bigger, and never more than the
    two blocks. The rank's own 1/dp of them is already counted in its shard."""
    block_dense, block_expert = MO.block_params_on_rank(x)
    units = np.minimum(2.0, n_blocks) * (
        block_dense * (1.0 - 1.0 / dp) + block_expert * (1.0 - 1.0 / edp)
    )
    live = x.sw.framework.zero3_max_live_params
    if live is None:
        return units
    return np.minimum(
        units, np.maximum(P.largest_module_params(x.spec) / x.tp, live) * (1.0 - 1.0 / dp)
    )


def host_room_bytes(x, params_rank):
    """Host memory one device may fill with offloaded activations: its share of the node's host memory
    after any offloaded optimizer states (fp32 master + states + 4 bytes of gradient per parameter,
    sharded from ZeRO-1)."""
    _, _, ob = state_bytes_per_param(x.sw, x.precision, x.optimizer)
    host_opt = np.where(
        x.is_offload("optimizer"),
        zero_sharded(params_rank * (ob + 4.0), x.shard_group, x.zero, 1),
        0.0,
    )
    return np.maximum(0.0, host_memory_bytes_per_node(x.hw) / x.hw.devices_per_node - host_opt)


USERBUFFERS_16BIT = 4
"""Transformer Engine's userbuffers kept in the compute dtype under any recipe: proj_fprop and
fc2_fprop (pipelined reduce-scatters) and qkv_wgrad, fc1_wgrad (bulk overlaps)."""


USERBUFFERS_FP8 = 6
"""Userbuffers held in FP8 (1 byte) under an FP8 recipe, else in the compute dtype: qkv_fprop,
fc1_fprop, proj_dgrad, fc2_dgrad (ring-exchange all-gathers), qkv_dgrad, fc1_dgrad (bulk)."""


def userbuffer_bytes(software, spec, precision, *, micro_batch, seq, cp, tp, sequence_parallel):
    """Device memory of the tensor-parallel overlap's communication buffers, per rank: Transformer
    Engine's userbuffers, registered once for the run, outside PyTorch's caching allocator and held
    the whole step. Megatron-LM's _initialize_tp_communicators (megatron/training/initialize.py)
    calls initialize_ub(shape=[seq x micro_batch / cp, hidden]), which allocates one buffer of that
    whole (gathered) shape for each of the 10 GEMM overlaps (transformer_engine/pytorch/module/
    base.py initialize_ub, add_ub; TE 1.x): USERBUFFERS_16BIT at 2 bytes and USERBUFFERS_FP8 at 1
    byte under FP8, else 2:
        s b / cp x hidden x (2 x 4 + f x 6),  f = 1 under FP8, else 2.
    Zero where the run does not overlap (comm.tp_overlapped) and on stacks without Transformer
    Engine's modules (torchtitan's async TP: symmetric memory, not costed here)."""
    if not software.tp_comm_overlap or software.framework.kernels != "fused":
        return 0.0
    on = tp_overlapped(True, tp, sequence_parallel)
    per_element = 2.0 * USERBUFFERS_16BIT + (1.0 if precision == "fp8" else 2.0) * USERBUFFERS_FP8
    tokens = np.asarray(micro_batch, dtype=float) * seq / np.asarray(cp, dtype=float)
    return np.where(on, tokens * spec.hidden * per_element, 0.0)


def _fp8_weight_bytes(x, split, dp, edp, param_bytes):
    """What an FP8 recipe adds to (or, holding FP8 parameters, takes from) the rank's parameter
    memory: the FP8 copies of every GEMM weight the rank stores (`split`: cost_models.moe.
    RankParams, less what stays 16-bit) a stack keeps for the step (frameworks:
    fp8_weight_cache_bytes; all its local experts included; sharded with the parameters under
    ZeRO-3, FSDP keeping them per shard, the experts over their own group); with
    fp8_param_gather on such a stack,
    each GEMM weight is an FP8 tensor that is one of those copies, its 16-bit parameter gone
    (cost_models.step.Software.fp8_param_gather)."""
    if x.precision != "fp8":
        return 0.0
    # the stack's FP8 copies, in the recipe's element size (NVFP4: two 4-bit copies, their scales)
    cache = x.sw.framework.fp8_weight_cache_bytes * quantized_bytes(x.sw.fp8_scaling) / FP8_BYTES
    fp8_params = x.sw.gathers_fp8(x.precision, x.zero) & (cache > 0)
    # the 16-bit parameter and the copies become one FP8 tensor and its transpose: cache - param
    held = np.where(fp8_params, cache - param_bytes, cache)
    dense = zero_sharded(split.dense_gemm * held, dp, x.zero, 3)
    return dense + zero_sharded(split.expert * held, edp, x.zero, 3)


def _gathered_param_bytes(x, zero, gather_bytes):
    """Bytes per element of a parameter as ZeRO-3 gathers it: the recipe's low precision where the
    run gathers its GEMM weights so (Software.gathers_fp8), else the gather dtype's."""
    low = quantized_bytes(x.sw.fp8_scaling)
    return np.where(x.sw.gathers_fp8(x.precision, zero), low, gather_bytes)


def _fp8_master_bytes(x, split, dp, edp):
    """What 16-bit master remainders (master_weights 'remainder') cannot save on FP8 parameters.
    A remainder is the low half of an fp32 master whose high half is the bf16 parameter; an FP8
    GEMM weight (Software.gathers_fp8) has no bf16 half, so the optimizer keeps its whole fp32
    master: Transformer Engine's FusedAdam, which Megatron-Core's precision-aware optimizer runs,
    stores remainders only for bf16 parameters (store_param_remainders and param.dtype ==
    torch.bfloat16). Per GEMM weight, 4 bytes less the remainder's, sharded with the optimizer
    states (ZeRO >= 1; the experts over their own group); embeddings, head and norms keep their
    remainders. (NeMo 1.x's Apex optimizer instead turns remainders off for every parameter when
    fp8_params is on, store_params; benchmarks/published_rows.options_of reads such rows so.)"""
    if x.sw.master_weights != "remainder" or x.precision != "fp8":
        return 0.0
    extra = np.where(
        x.sw.gathers_fp8(x.precision, x.zero), 4.0 - x.sw.state_bytes("fp8").master, 0.0
    )
    dense = zero_sharded(split.dense_gemm * extra, dp, x.zero, 1)
    return dense + zero_sharded(split.expert * extra, edp, x.zero, 1)


def rank_memory(x, rank, n_blocks, acts: ActivationBytes, *, host_room) -> RankMemory:
    """Peak of pipeline rank `rank` (0-based) holding `n_blocks` blocks (peak_bytes' three moments):
    model states by ZeRO stage (optimizer from 1, gradients from 2, parameters from 3 plus the block in
    use and the one prefetched; Rajbhandari et al. 2020 Sec. 5), activations of the micro-batches the
    schedule keeps in flight (cost_models.pipeline.inflight_microbatches), the embedding on rank 0, the
    head, logits and loss on the last rank, the autocast weight cache, DDP's bucket copy of the
    gradients, and offloaded activations limited to what the host can take (`host_room`). The routed
    experts of an MoE model are sharded over ep x expert_tp and ZeRO-sharded over their expert
    data-parallel group (cost_models.moe.rank_params; Megatron-Core's expert parallelism)."""
    spec, fw, tp, zero = x.spec, x.sw.framework, x.tp, x.zero
    dp = x.shard_group  # ZeRO shards over dp x cp, or the hybrid shard group
    edp = (
        x.expert_shard_group
    )  # ... and the routed experts over their expert data-parallel shard group
    is_first, is_last = np.asarray(rank) == 0, np.asarray(rank) == x.pp - 1
    split = MO.rank_params(x, n_blocks, is_first, is_last)
    n_params = split.total
    pb, gb, ob = state_bytes_per_param(x.sw, x.precision, x.optimizer)

    def sharded(bytes_per_param, from_stage):
        return zero_sharded(split.dense * bytes_per_param, dp, zero, from_stage) + zero_sharded(
            split.expert * bytes_per_param, edp, zero, from_stage
        )

    recomputed = x.recomputed_blocks(n_blocks, rank)
    held = _held_activations(x, rank, n_blocks, acts, recomputed, host_room=host_room)
    gather_bytes = x.sw.state_bytes(
        x.precision
    ).gather  # FSDP gathers the 16-bit copy (param_dtype)
    live_bytes = _gathered_param_bytes(x, zero, gather_bytes)
    zero3_live = np.where(zero >= 3, zero3_live_params(x, n_blocks, dp, edp) * live_bytes, 0.0)
    params_b = sharded(pb, 3) + zero3_live + _fp8_weight_bytes(x, split, dp, edp, pb)
    grads_b = sharded(gb, 2)
    buckets = np.where(fw.grad_bucket_copy & (zero == 0) & (x.grad_group > 1), n_params * gb, 0.0)
    opt_b = np.where(
        x.is_offload("optimizer"), 0.0, sharded(ob, 1) + _fp8_master_bytes(x, split, dp, edp)
    )
    head_w = spec.vocab * spec.hidden / tp
    cache_fwd, cache_bwd = _weight_cache(x, n_blocks, recomputed, is_last, gather_bytes)
    tied_grad = head_w * 4.0 if x.c == 2 and x.precision != "bf16" else head_w * gb * 2.0
    metric_bytes = B.metric_transient(spec, x.precision, x.sw.train_metrics)
    peak, acts_b, other = ResidentBytes(
        params=params_b,
        grads=grads_b + buckets,
        optimizer=opt_b,
        grads_present=grads_persist(fw.grads_persist, x.m) | (buckets > 0),
        cache_fwd=cache_fwd,
        cache_bwd=cache_bwd,
        activations=held,
        logits_fwd_end=np.where(is_last, x.per_token(x.head.logits_fwd_end) * x.tokens, 0.0),
        logits_peak=np.where(is_last, x.per_token(x.head.logits_peak) * x.tokens, 0.0),
        last_grad_transient=np.where(is_first & spec.tied_embeddings, tied_grad, 0.0),
        metric_transient=np.where(is_last, x.per_token(metric_bytes) * x.tokens, 0.0),
        recompute_transient=np.where(x.full, acts.block_no_recompute, 0.0),
        workspace=efficiency(x.hw, "framework_workspace_bytes")
        + userbuffer_bytes(
            x.sw,
            spec,
            x.precision,
            micro_batch=x.b,
            seq=x.seq,
            cp=x.cp,
            tp=tp,
            sequence_parallel=x.sp,
        ),
    ).peak()
    return RankMemory(
        peak=peak,
        params=params_b,
        grads=grads_b + buckets,
        optimizer=opt_b,
        activations=acts_b,
        other=other,
        saved=held,
    )


def _held_activations(x, rank, n_blocks, acts: ActivationBytes, recomputed, *, host_room):
    """Activations rank `rank` holds at its peak: those of the micro-batches the schedule keeps in
    flight (cost_models.pipeline.inflight_microbatches) over its blocks (full recomputation of only
    `recomputed` blocks per chunk, Step.recomputed_blocks: the others keep all), the embedding's on
    the first rank and the head's on the last, less what is offloaded and the host can take."""
    is_first, is_last = np.asarray(rank) == 0, np.asarray(rank) == x.pp - 1
    inflight = inflight_microbatches(x.schedule, x.pp, x.m, x.v, rank, SCHEDULES)
    blocks_b = np.where(
        x.full,
        recomputed * acts.block + (n_blocks - recomputed) * acts.block_no_recompute,
        n_blocks * acts.block,
    )
    held = inflight * (blocks_b + np.where(is_first, acts.embedding, 0.0)) + np.where(
        is_last, acts.head_inflight * acts.head, 0.0
    )
    # What offloaded activations still occupy on the device at the peak. Everything offloaded
    # (DeepSpeed's cpu_checkpointing): the block in use and the one reloaded ahead of it. The first
    # N of n blocks (Transformer Engine's CPU offload context; TE cpu_offload.py
    # AsyncDoubleBufferGroupOffloadHandler): at the start of the backward the rank holds its n - N
    # blocks and one group, the last offloaded, reloaded ahead (on_group_commit_backward reloads a
    # group every n / N layers while each layer's backward frees one kept block, so the holding only
    # falls from there). Beyond what the host can take, the excess stays.
    share = offloaded_share(x, n_blocks)  # the offloaded blocks' share (all, or the first N blocks)
    off = held * share
    reload = np.where(
        share < 1.0, acts.block, 2 * acts.block_no_recompute + np.where(is_last, acts.head, 0.0)
    )
    return (
        held
        - off
        + np.where(
            x.is_offload("activations"), np.maximum(np.minimum(off, reload), off - host_room), 0.0
        )
    )


def _weight_cache(x, n_blocks, recomputed, is_last, gather_bytes) -> tuple:
    """(forward, backward) bytes of torch.autocast's cache of the 16-bit casts of a rank's fp32 GEMM
    weights. Under FSDP's mixed precision (ZeRO >= 2 gathering 16-bit copies:
    MixedPrecision(param_dtype=bf16), as Composer's DEFAULT, fms-fsdp and Accelerate's bf16 FSDP set
    it) the forward sees bf16 weights and nothing is cast. Full recomputation re-casts a block's
    weights when it re-runs; blocks it does not re-run keep their casts into the backward."""
    cache = (x.sw.framework.autocast_weight_cache and x.precision.startswith("amp")) & ~(
        (x.zero >= 2) & (gather_bytes < 4)
    )
    head_w = x.spec.vocab * x.spec.hidden / x.tp
    cache_head = np.where(is_last, head_w, 0.0) * 2.0 * cache
    per_block = MO.block_weights_on_rank(x) * 2.0 * cache
    cache_all = n_blocks * per_block + cache_head
    return cache_all, np.where(x.full, cache_head + (n_blocks - recomputed) * per_block, cache_all)


def peak_over_ranks(x, acts: ActivationBytes, *, host_room, rank_blocks=None):
    """The highest rank's memory (RankMemory) and, with explicit per-rank blocks (shape (candidates, R),
    -1 past pp), every rank's terms ((candidates, R) arrays, NaN past pp). Without them the first and
    the last rank are evaluated: with an even split they hold the peak (rank 0 has the most blocks and
    micro-batches in flight, the last rank the head)."""
    best = rank_memory(x, 0.0, x.blocks_first, acts, host_room=host_room).higher(
        rank_memory(x, x.pp - 1.0, x.blocks_last, acts, host_room=host_room)
    )
    if rank_blocks is None and x.spec.moe is not None:
        # mixture of experts: the first rank holds the dense blocks (moe.rank_params), so the second rank, with
        # only expert blocks, the most of them after the first and the most micro-batches in flight after it,
        # can hold the peak; the ranks after it hold no more (fewer or as many blocks, fewer in flight)
        best = best.higher(
            rank_memory(x, np.minimum(1.0, x.pp - 1.0), x.blocks_second, acts, host_room=host_room),
            x.pp > 2,
        )
    if rank_blocks is None:
        return best, None
    rb = np.atleast_2d(np.asarray(rank_blocks, dtype=float))
    names = {
        "peak_bytes": "peak",
        "params_bytes": "params",
        "grads_bytes": "grads",
        "optimizer_bytes": "optimizer",
        "activations_bytes": "activations",
        "other_bytes": "other",
    }
    if rb.shape[0] == 1 and np.shape(x.pp) == (1,):
        return _one_candidate_ranks(x, best, rb[0], acts, host_room=host_room, names=names)
    cols = [
        rank_memory(x, float(j), np.where(j < x.pp, rb[:, j], 0.0), acts, host_room=host_room)
        for j in range(rb.shape[1])
    ]
    for j, r_j in enumerate(cols):
        best = best.higher(r_j, j < x.pp)
    per_rank = {
        name: np.stack(
            [
                np.where(j < x.pp, np.broadcast_to(getattr(c, f), x.pp.shape), np.nan)
                for j, c in enumerate(cols)
            ],
            axis=1,
        )
        for name, f in names.items()
    }
    return best, per_rank


def _one_candidate_ranks(x, best: RankMemory, blocks, acts: ActivationBytes, *, host_room, names):
    """peak_over_ranks for one candidate with explicit per-rank blocks (estimate's per-rank memory): rank_memory of
    every rank j in one call over the vector of ranks (elementwise, so each rank's numbers are those of its own
    call); the highest of them replaces `best` where it is strictly higher (the first such rank, as the rank-by-rank
    comparison of the batched path keeps it)."""
    ranks = np.arange(len(blocks), dtype=float)
    live = ranks < x.pp[0]
    every = rank_memory(x, ranks, np.where(live, blocks, 0.0), acts, host_room=host_room)
    whole = {f: np.broadcast_to(getattr(every, f), ranks.shape) for f in RankMemory.__slots__}
    peaks = np.where(live, whole["peak"], -np.inf)
    top = int(np.argmax(peaks))
    if peaks[top] > best.peak[0]:
        best = RankMemory(**{f: v[top : top + 1] for f, v in whole.items()})
    per_rank = {name: np.where(live, whole[f], np.nan)[None, :] for name, f in names.items()}
    return best, per_rank


def allocator_overhead(software) -> float:
    """Reserved / allocated - 1 at the peak. PyTorch's default caching allocator carves fixed segments into
    blocks, and a free block stays in its segment whatever sizes later requests need: the framework's
    `allocator_overhead_fraction` (median 0.052 over the 42 measured H100 steps). With expandable segments
    (Software.expandable_segments) each stream has one segment whose physical memory is mapped in 2 MiB pages
    as it grows, and on a failed request the allocator unmaps the free pages and maps them where they are
    needed (PyTorch PR 96995, "Expandable blocks in allocator"; c10/cuda/CUDACachingAllocator.cpp): at the
    peak only partly used pages stay unusable, a few MiB per segment, so the overhead is taken as 0."""
    return 0.0 if software.expandable_segments else software.framework.allocator_overhead_fraction


def needed_bytes(peak_bytes, hw, software):
    """What the device must hold for a peak of `peak_bytes` allocated: the allocator's overhead
    (allocator_overhead) on top of the peak, and the CUDA context outside it (`cuda_context_bytes`):
    peak x (1 + overhead) + context."""
    return np.asarray(peak_bytes, dtype=float) * (
        1.0 + allocator_overhead(software)
    ) + cuda_context_bytes(hw)


def largest_fitting_peak(hw, software) -> float:
    """The largest peak that `fits`: needed_bytes solved for the peak at the device's memory."""
    return (float(hw.memory_bytes) - cuda_context_bytes(hw)) / (1.0 + allocator_overhead(software))


def fits(peak_bytes, hw, software):
    """The one definition of "fits" (planner.score.Scores.fits, read by search, estimate, explain,
    report and plan files): needed_bytes <= the device's usable memory."""
    return needed_bytes(peak_bytes, hw, software) <= float(hw.memory_bytes)
