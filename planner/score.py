"""The one cost model: step time and peak memory of many candidate configurations at once (numpy).

`score(model, hw, cands, ...)` evaluates arrays of candidates in one pass; `planner.estimate`
calls it with arrays of length 1, so the scalar and the vectorized answers are the same code.
Every term is a pure function from cost_models (formulas and sources in their docstrings):

  per block and micro-batch   GEMMs (compute.gemm_*), attention (flash or unfused), memory-bound
                              kernels (blocks.block_table traffic / bandwidth), tensor-parallel
                              all-reduces (2 forward + 2 backward, Megatron; RS + AG with SP, same
                              volume), recomputation (selective: attention core; full: the forward)
  per stage                   blocks x per-block + embedding (first) + head and loss (last)
  per step                    m x slowest stage + bubble (pipeline.bubble_slots) + pipeline p2p
                              + exposed data-parallel reduction (overlapped with the last backward)
                              + optimizer step + offload; never faster than the host can dispatch
  memory                      memory.peak_bytes over the first and the last pipeline rank, or over
                              every rank when CandidateArrays.rank_blocks gives an uneven split
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

import numpy as np

from cost_models import blocks as B
from cost_models import comm as C
from cost_models import compute as K
from cost_models import memory as M
from cost_models import offload as O
from cost_models import params as P
from cost_models import pipeline as PL
from cost_models.flops import block_gemm_shapes, model_flops_per_step
from hardware_profiles import HardwareProfile
from planner.errors import ConfigError
from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES
from planner.placement import group_locality
from planner.spec import TransformerSpec

DDP_BUCKET_BYTES = 25 * 2**20
"""Gradient bucket of PyTorch DDP (bucket_cap_mb=25): the last bucket's reduction cannot overlap."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CandidateArrays:
    """Candidates as parallel arrays (one entry per candidate); indices refer to the tuples in
    planner.parallel (RECOMPUTE, OFFLOAD, SCHEDULES) and planner.placement.PLACEMENTS."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    micro_batch: np.ndarray
    virtual_stages: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray
    offload: np.ndarray
    sequence_parallel: np.ndarray
    schedule: np.ndarray
    placement: np.ndarray
    blocks_first: np.ndarray | None = None
    """Blocks held by the first pipeline rank (all its chunks); None means an even split."""
    blocks_last: np.ndarray | None = None
    """Blocks held by the last pipeline rank; None means an even split."""
    blocks_max: np.ndarray | None = None
    """Blocks of the busiest pipeline rank; None means an even split."""
    rank_blocks: np.ndarray | None = None
    """Blocks of every pipeline rank, shape (candidates, R), -1 past each candidate's pp. When given,
    the memory of every rank is evaluated (Scores.stage_memory) and the peak is their maximum; else
    only the first and the last rank are (with an even split they hold the peak: rank 0 has the
    most blocks and the most micro-batches in flight, the last rank the head)."""

    @classmethod
    def from_mapping(cls, arrays: Mapping[str, np.ndarray]) -> "CandidateArrays":
        names = {f.name for f in fields(cls)}
        return cls(**{k: np.asarray(v) for k, v in arrays.items() if k in names})

    @classmethod
    def concat(cls, parts: "list[CandidateArrays]") -> "CandidateArrays":
        """One set of candidates from several (rank_blocks padded with -1 to the widest)."""
        out = {}
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if any(x is None for x in values):
                if not all(x is None for x in values):
                    raise ValueError(f"{f.name} given for some parts only")
                continue
            if f.name == "rank_blocks":
                width = max(np.atleast_2d(x).shape[1] for x in values)
                values = [np.pad(np.atleast_2d(x), ((0, 0), (0, width - np.atleast_2d(x).shape[1])),
                                 constant_values=-1) for x in values]
            out[f.name] = np.concatenate(values)
        return cls(**out)


@dataclass(frozen=True, kw_only=True, slots=True)
class Scores:
    """Per-candidate results (arrays). Times in seconds per optimizer step, bytes per GPU."""

    step_time_s: np.ndarray
    peak_bytes_per_gpu: np.ndarray
    capacity_bytes: float
    fits: np.ndarray
    """peak x (1 + allocator overhead) + CUDA context <= capacity (memory.allocator_overhead_fraction)."""
    params_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    other_bytes: np.ndarray
    compute: np.ndarray
    """Forward + backward (+ recompute) of the slowest stage over all micro-batches, without TP comm."""
    recompute: np.ndarray
    """Part of `compute` spent re-running forwards."""
    tp_comm: np.ndarray
    dp_comm: np.ndarray
    """Exposed (non-overlapped) data-parallel / ZeRO communication."""
    pp_p2p: np.ndarray
    bubble: np.ndarray
    optimizer: np.ndarray
    offload: np.ndarray
    host_wait: np.ndarray
    """Extra time when the host cannot issue the kernels as fast as the device runs them."""
    num_microbatches: np.ndarray
    model_flops_per_step: float
    """6 N tokens + attention, recomputation not counted (the MFU numerator)."""
    stage_memory: dict | None = None
    """With CandidateArrays.rank_blocks: per pipeline rank, shape (candidates, R), NaN past pp:
    peak_bytes, params_bytes, grads_bytes, optimizer_bytes, activations_bytes, other_bytes."""

    BREAKDOWN = ("compute", "tp_comm", "dp_comm", "pp_p2p", "bubble", "optimizer", "offload", "host_wait")
    """Terms that add up to step_time_s."""


def _layers(cands: CandidateArrays, blocks: int):
    """(first, last, max) blocks per pipeline rank. Even split (planner.estimate.even_stages): the
    p v chunks get q = L // (p v) blocks and the first r = L % (p v) one more; rank k runs chunks
    k, k + p, ... so it holds v q + ceil((r - k) / p)^+ blocks; rank 0 holds the most."""
    pp = cands.pp.astype(float)
    v = cands.virtual_stages.astype(float)
    q, r = np.floor(blocks / (pp * v)), blocks - np.floor(blocks / (pp * v)) * pp * v
    even_first = v * q + np.ceil(r / pp)
    even_last = v * q + np.maximum(0.0, np.ceil((r - pp + 1) / pp))
    first = even_first if cands.blocks_first is None else cands.blocks_first.astype(float)
    last = even_last if cands.blocks_last is None else cands.blocks_last.astype(float)
    most = even_first if cands.blocks_max is None else cands.blocks_max.astype(float)
    return first, last, np.maximum(most, np.maximum(first, last))


def score(model, hw: HardwareProfile, cands: CandidateArrays | Mapping, *, global_batch: int, seq: int,
          precision: str = "amp-bf16", optimizer: str = "adamw", impl: str = "megatron", flash: bool = True,
          dropout: bool = False, overlap_grad_reduce: bool = True) -> Scores:
    """Step time and peak memory of every candidate (see the module docstring).

    impl: 'megatron' (fused kernels, Korthikanti's activation counts, 18-byte mixed-precision
    states) or 'eager' (PyTorch eager / Hugging Face modules under autocast). flash: fused
    attention (False: Megatron 2022's materialized softmax). dropout: dropout layers active.
    overlap_grad_reduce: the data-parallel reduction runs in buckets during the last backward
    (PyTorch DDP, FSDP, Megatron-core's --overlap-grad-reduce); False: after the backward (Megatron-LM
    2021-22's local DDP), fully exposed.
    """
    if not isinstance(model, TransformerSpec):
        raise ConfigError("model", getattr(model, "name", type(model).__name__),
                          "a transformer (catalog name or HF config); nn.Module factories are profiled, not scored")
    if not isinstance(cands, CandidateArrays):
        cands = CandidateArrays.from_mapping(cands)
    spec = model
    s = float(seq)
    f64 = lambda a: np.asarray(a, dtype=float)
    dp, tp, pp = f64(cands.dp), f64(cands.tp), f64(cands.pp)
    b, v, zero = f64(cands.micro_batch), f64(cands.virtual_stages), np.asarray(cands.zero)
    sp = np.asarray(cands.sequence_parallel, dtype=bool) & (tp > 1)
    rc, off, sched = np.asarray(cands.recompute), np.asarray(cands.offload), np.asarray(cands.schedule)
    m = global_batch / (dp * b)
    tokens = b * s                                   # per micro-batch per replica
    c = B.compute_bytes(precision)
    blocks = spec.total_blocks
    local = group_locality(cands.placement, cands.dp, cands.pp, cands.tp, hw.devices_per_node)
    mem_bw = K.memory_Bps(hw)

    # ---- one block, one micro-batch (seconds) -------------------------------------------------
    table = B.block_table(spec, precision, impl, flash=flash, dropout=dropout)
    rep_factor, inv_tp = np.where(sp, 1.0 / tp, 1.0), 1.0 / tp

    def per_token(terms: B.Terms):
        """Terms.at(tp, sp, s) with the tp/sp factors computed once for all candidates."""
        return terms.rep * rep_factor + (terms.shard + terms.seq * s) * inv_tp

    gemm_f = gemm_b = attn_f = attn_b = 0.0
    kw = dict(hw=hw, precision=precision, elem_bytes=float(c))
    for g in block_gemm_shapes(spec, b, s, tp=tp):
        if g.name in ("qk", "av"):
            if flash:
                continue
            f_, b_ = K.gemm_fwd_bwd_seconds(g.m, g.n, g.k, g.batch, **kw)
            attn_f, attn_b = attn_f + f_, attn_b + b_
        else:
            f_, b_ = K.gemm_fwd_bwd_seconds(g.m, g.n, g.k, g.batch, **kw)
            gemm_f, gemm_b = gemm_f + f_, gemm_b + b_
    if flash:
        attn_f, attn_b = K.flash_attention_seconds(b, s, spec.heads / tp, spec.d_head, causal=spec.causal,
                                                   hw=hw, precision=precision)
    elem_f = per_token(table.traffic_fwd) * tokens / mem_bw
    elem_b = B.BWD_TRAFFIC_FACTOR * elem_f
    scores_f = per_token(table.scores_traffic_fwd) * tokens / mem_bw
    act_msg = tokens * spec.hidden * c
    ar = C.group_collective_seconds("allreduce", act_msg, tp, local["T"], hw)
    tp_f = tp_b = 2.0 * ar                           # Megatron: f/g operators, 2 per block each way
    layer_f = gemm_f + attn_f + elem_f
    layer_b = gemm_b + attn_b + elem_b
    rec = np.select([rc == RECOMPUTE.index("full"), rc == RECOMPUTE.index("selective")],
                    [layer_f, attn_f + scores_f], 0.0)
    tp_rec = np.where(rc == RECOMPUTE.index("full"), tp_f, 0.0)
    if impl == "eager":
        # torch.distributed.pipelining's zero-bubble schedules re-run a checkpointed block's forward
        # about 6 times per micro-batch instead of 2 (measured here, docs/executor-notes.md).
        zb_rerun = np.where((sched == SCHEDULES.index("zero-bubble")) & (rc == RECOMPUTE.index("full")), 5.0, 1.0)
        rec, tp_rec = rec * zb_rerun, tp_rec * zb_rerun

    # ---- output side (last stage) and input side (first stage) --------------------------------
    head = B.head_table(spec, precision, impl)
    hf_, hb_ = K.gemm_fwd_bwd_seconds(tokens, spec.vocab / tp, spec.hidden, **kw)
    head_s = hf_ + hb_ + (per_token(head.traffic_fwd) + per_token(head.traffic_bwd)) * tokens / mem_bw
    emb_s = np.where(tp > 1, 2.0 * ar, 0.0) + 3.0 * tokens * spec.hidden * c / mem_bw   # vocab-parallel lookup

    first, last, most = _layers(cands, blocks)
    per_block = layer_f + layer_b + rec
    per_block_tp = tp_f + tp_b + tp_rec
    only_stage = pp == 1
    t_first = first * (per_block + per_block_tp) + emb_s + np.where(only_stage, head_s, 0.0)
    t_last = last * (per_block + per_block_tp) + head_s + np.where(only_stage, emb_s, 0.0)
    t_most = most * (per_block + per_block_tp)
    t_stage = np.maximum(np.maximum(t_first, t_last), t_most)
    t_mean = (blocks * (per_block + per_block_tp) + emb_s + head_s) / pp
    share_tp = most * per_block_tp / np.maximum(t_most, 1e-30)

    ideal = m * t_stage
    bubble = PL.bubble_slots(sched, pp, v, SCHEDULES, m) * t_mean
    # Ranks that share cores (a CPU profile: 4 gloo ranks on 2 cores, compute rates measured with all
    # ranks busy) run up to `shared_cores_speedup` times faster while others idle in the bubble, but
    # the node cannot finish its total work sooner than with every rank busy: the busy span becomes
    # max(ideal, (ideal + bubble) / speedup). 1 (no effect) for accelerators, which share nothing.
    speedup = K.eff(hw, "shared_cores_speedup")
    if speedup > 1.0:
        bubble = np.maximum(0.0, (ideal + bubble) / speedup - ideal)
    compute = ideal * (1.0 - share_tp)
    tp_comm = ideal * share_tp
    recompute_s = m * most * rec

    # ---- pipeline point-to-point ----------------------------------------------------------------
    p2p_bytes = act_msg / np.where(sp | (impl == "megatron"), tp, 1.0)
    in_node = local["P"] >= pp
    bw = np.where(in_node, C.intra_bus_Bps(hw, "p2p"), C.inter_bus_Bps_per_node(hw, "p2p") / hw.devices_per_node)
    lat = np.where(in_node, hw.intra_node_latency_us, hw.inter_node_latency_us) * 1e-6
    hop = C.p2p_seconds(p2p_bytes, bw, lat)
    hop = hop + np.where(sp | (impl != "megatron"), 0.0,
                         C.group_collective_seconds("allgather", act_msg, tp, local["T"], hw))
    pp_p2p = PL.p2p_transfers_on_critical_path(pp, m, v) * hop

    # ---- parameters per rank ----------------------------------------------------------------------
    block_p = P.block_params(spec)
    emb_p = P.embedding_params(spec)
    head_p = P.head_params(spec) + P.final_norm_params(spec)
    tied_copy = spec.vocab * spec.hidden if spec.tied_embeddings else 0
    params_first = (first * block_p + emb_p + np.where(only_stage, head_p, 0.0)) / tp
    params_last = (last * block_p + head_p + np.where(only_stage, emb_p, tied_copy)) / tp
    params_rank = np.maximum(params_first, params_last)

    # ---- data parallel / ZeRO ------------------------------------------------------------------------
    pb, gb, ob = M.state_bytes_per_param(precision, optimizer, impl)
    grad_comm = params_rank * gb
    # Stages 0-2 reduce once per step with an all-reduce's volume (RS + AG for 1-2; Rajbhandari et
    # al. 2020, Sec. 7), overlapped with the last micro-batch's backward bucket by bucket (the last
    # bucket cannot hide).
    t_dp = C.group_collective_seconds("allreduce", grad_comm, dp, local["D"], hw)
    tail = np.minimum(1.0, DDP_BUCKET_BYTES / np.maximum(grad_comm, 1.0))
    last_bwd = most * (layer_b + rec + tp_b + tp_rec)

    def overlapped(t, under):
        """Exposed part of a bucketed collective of t seconds running beside `under` seconds of compute."""
        return np.maximum(t - (1 - tail) * under, tail * t) if overlap_grad_reduce else t

    # ZeRO-2 and -3 keep only a gradient shard, so under gradient accumulation every micro-batch's
    # backward reduce-scatters its gradients (DeepSpeed stages 2-3 reduce in each micro-step's backward
    # hooks; FSDP reduce-scatters every backward unless sync is disabled, which keeps full gradients).
    # ZeRO-1 accumulates full gradients and reduces once. Each of ZeRO-2's m-1 extra reduce-scatters
    # overlaps its own micro-batch's backward.
    rs_grads = C.group_collective_seconds("reduce_scatter", grad_comm, dp, local["D"], hw)
    z2_extra = np.where((zero == 2) & (m > 1), m - 1.0, 0.0)
    low_comm = t_dp + z2_extra * rs_grads
    low_exposed = overlapped(t_dp, last_bwd) + z2_extra * overlapped(rs_grads, last_bwd)
    # ZeRO-3: per micro-batch, parameters are all-gathered for the forward and again for the backward
    # and gradients reduce-scattered (Rajbhandari et al. 2020, Sec. 7.2); all of it shares one link
    # and hides under the stage's compute of all m micro-batches, except the last gradient bucket.
    gather = C.group_collective_seconds("allgather", params_rank * c, dp, local["D"], hw)
    z3_comm = m * (2.0 * gather + rs_grads)
    capacity = m * most * per_block
    z3_exposed = (np.maximum(z3_comm - capacity, tail * rs_grads) if overlap_grad_reduce
                  else m * rs_grads + np.maximum(0.0, m * 2.0 * gather - capacity))
    comm = np.where(zero >= 3, z3_comm, low_comm)
    exposed = np.where(zero >= 3, z3_exposed, low_exposed)
    # Communication hidden under compute still slows it: NCCL kernels occupy SMs and HBM bandwidth.
    interference = K.eff(hw, "overlap_interference")
    dp_comm = np.where(dp > 1, exposed + interference * (comm - exposed), 0.0)
    # Tied input/output embeddings split across the first and last pipeline stage: their gradient
    # copies are all-reduced after the backward, not overlapped (cost_models.comm).
    if spec.tied_embeddings:
        tied_sync = C.tied_embedding_sync_seconds(spec.vocab, spec.hidden, tp, gb, local["P"] >= pp, hw)
        dp_comm = dp_comm + np.where(pp > 1, tied_sync, 0.0)

    # ---- optimizer and offload ----------------------------------------------------------------------
    updated = np.where(zero >= 1, params_rank / dp, params_rank)
    opt_s = K.optimizer_seconds(updated, precision=precision, optimizer=optimizer, hw=hw, impl=impl)
    off_opt = off == OFFLOAD.index("optimizer")
    off_act = off == OFFLOAD.index("activations")
    opt_s = np.where(off_opt, O.optimizer_offload_seconds(updated, gb, hw), opt_s)

    # ---- memory ---------------------------------------------------------------------------------------
    saved_full = per_token(table.saved)
    saved = np.select([rc == RECOMPUTE.index("full"), rc == RECOMPUTE.index("selective")],
                      [per_token(table.saved_full_recompute),
                       saved_full - per_token(table.scores_saved)], saved_full) * tokens
    one_block = saved_full * tokens
    inflight_head = np.where(only_stage, 1.0, PL.inflight_microbatches_last_stage(sched, m, SCHEDULES))
    emb_saved = per_token(B.embedding_saved(spec, precision, dropout=dropout)) * tokens
    head_saved = per_token(head.saved) * tokens
    # Offloaded activations: every micro-batch's saved tensors go to the host and come back; the GPU
    # keeps about two blocks' worth in flight, and whatever the host cannot hold (its memory is shared
    # by the node's devices, after any offloaded optimizer states) stays on the GPU.
    host_opt = np.where(off_opt, M.zero_sharded(params_rank * (ob + 4.0), dp, zero, 1), 0.0)
    host_room = np.maximum(0.0, O.host_memory_bytes_per_node(hw) / hw.devices_per_node - host_opt)
    act_volume = m * np.maximum(first * saved + emb_saved, last * saved + head_saved)
    fwd_share = (layer_f + tp_f) / np.maximum(per_block + per_block_tp, 1e-30)
    act_offload_s = np.where(off_act, O.activation_offload_seconds(act_volume, ideal * fwd_share,
                                                                  ideal * (1 - fwd_share), hw), 0.0)
    act_offload_s = act_offload_s + np.where(off_act, K.eff(hw, "overlap_interference")
                                             * np.minimum(2.0 * act_volume / O.pcie_Bps(hw), ideal), 0.0)

    workspace = K.eff(hw, "framework_workspace_bytes")
    grads_present = M.grads_persist(impl, m)
    amp_cache = impl == "eager" and precision.startswith("amp")
    gemm_w_block = P.block_matmul_weights(spec) / tp
    head_w = spec.vocab * spec.hidden / tp
    full = rc == RECOMPUTE.index("full")

    def rank_peak(k, n_blocks):
        """Peak of pipeline rank k (0-based) holding n_blocks blocks: the embedding on rank 0, the
        final norm, head and loss (and a tied head's copy) on rank pp - 1, the schedule's in-flight
        micro-batches of rank k (cost_models.pipeline.inflight_microbatches)."""
        is_first, is_last = np.asarray(k) == 0, np.asarray(k) == pp - 1
        n_params = (n_blocks * block_p + np.where(is_first, emb_p, 0.0) + np.where(is_last, head_p, 0.0)
                    + np.where(is_last & ~is_first, tied_copy, 0.0)) / tp
        inflight = PL.inflight_microbatches(sched, pp, m, v, k, SCHEDULES)
        acts = inflight * (n_blocks * saved + np.where(is_first, emb_saved, 0.0)) \
            + np.where(is_last, inflight_head * head_saved, 0.0)
        kept = 2 * one_block + np.where(is_last, head_saved, 0.0)
        acts = np.where(off_act, np.maximum(np.minimum(acts, kept), acts - host_room), acts)
        # ZeRO-3 gathers the block in use and the one prefetched (the rest of each stays sharded).
        zero3_live = np.where(zero >= 3, np.minimum(2.0, n_blocks) * block_p / tp * pb * (1.0 - 1.0 / dp), 0.0)
        params_b = M.zero_sharded(n_params * pb, dp, zero, 3) + zero3_live
        grads_b = M.zero_sharded(n_params * gb, dp, zero, 2)
        opt_b = np.where(off_opt, 0.0, M.zero_sharded(n_params * ob, dp, zero, 1))
        cache_all = (n_blocks * gemm_w_block + np.where(is_last, head_w, 0.0)) * 2.0 if amp_cache else 0.0 * tp
        cache_head = np.where(is_last, head_w, 0.0) * 2.0 if amp_cache else 0.0 * tp
        logits_fwd = np.where(is_last, per_token(head.logits_fwd_end) * tokens, 0.0)
        logits_peak = np.where(is_last, per_token(head.logits_peak) * tokens, 0.0)
        last_grad = np.where(is_first & spec.tied_embeddings, head_w * 4.0 if c == 2 and precision != "bf16" else head_w * gb * 2.0, 0.0)
        peak, acts_b, other = M.peak_bytes(
            params=params_b, grads=grads_b, optimizer=opt_b, grads_present=grads_present,
            cache_fwd=cache_all, cache_bwd=np.where(full, cache_head, cache_all), activations=acts,
            logits_fwd_end=logits_fwd, logits_peak=logits_peak, last_grad_transient=last_grad,
            recompute_transient=np.where(full, one_block, 0.0), workspace=workspace)
        return peak, params_b, grads_b, opt_b, acts_b, other

    def higher(best, other, where=True):
        """Per candidate, the rank whose peak (item 0) is higher, all its terms."""
        pick = where & (other[0] > best[0])
        return tuple(np.where(pick, o_, b_) for b_, o_ in zip(best, other))

    best = higher(rank_peak(0.0, first), rank_peak(pp - 1.0, last))
    stage_memory = None
    if cands.rank_blocks is not None:
        rb = np.atleast_2d(np.asarray(cands.rank_blocks, dtype=float))
        cols = []
        for j in range(rb.shape[1]):
            valid = j < pp
            r_j = rank_peak(float(j), np.where(valid, rb[:, j], 0.0))
            best = higher(best, r_j, valid)
            cols.append(tuple(np.where(valid, x, np.nan) for x in r_j))
        names = ("peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes")
        stage_memory = {name: np.stack([np.broadcast_to(c[i], pp.shape) for c in cols], axis=1)
                        for i, name in enumerate(names)}
    peak, params_b, grads_b, opt_b, acts_b, other_b = best

    # ---- step -------------------------------------------------------------------------------------------
    step = ideal + bubble + pp_p2p + dp_comm + opt_s + act_offload_s
    # host operator launches: forward, backward (about 2 per forward op), forward again when recomputing
    kernels = m * (blocks / pp) * table.kernels_fwd * (3.0 + full) + head.kernels
    host_wait = np.maximum(0.0, K.dispatch_seconds(kernels, hw) - step)
    step = step + host_wait
    capacity = float(hw.memory_bytes)
    # What the allocator holds at its peak (max_memory_allocated) is not all the device must hold:
    # the caching allocator's blocks are larger than their tensors (reserved / allocated: median 1.05
    # over the 42 H100 steps of validation/h100_train_steps.jsonl) and the CUDA context lives outside it.
    needed = peak * (1.0 + M.allocator_overhead_fraction(hw)) + M.cuda_context_bytes(hw)
    mflops = float(model_flops_per_step(spec, global_batch * seq, seq=seq))
    return Scores(step_time_s=step, peak_bytes_per_gpu=peak, capacity_bytes=capacity, fits=needed <= capacity,
                  params_bytes=params_b, grads_bytes=grads_b, optimizer_bytes=opt_b, activations_bytes=acts_b,
                  other_bytes=other_b, compute=compute, recompute=recompute_s, tp_comm=tp_comm, dp_comm=dp_comm,
                  pp_p2p=pp_p2p, bubble=bubble, optimizer=opt_s, offload=act_offload_s, host_wait=host_wait,
                  num_microbatches=m,
                  model_flops_per_step=mflops, stage_memory=stage_memory)
