"""The one cost model: step time and peak memory of many candidate configurations at once (numpy).

`score(model, hw, cands, ...)` evaluates arrays of candidates in one pass; `planner.estimate`
calls it with arrays of length 1, so the scalar and the vectorized answers are the same code.
It is a short composition of named terms, each a pure function in cost_models with its formula and
source in its docstring and a unit test; the candidates, the hardware profile and the software
(framework profile, attention kernel, dropout) are resolved once into a frozen `cost_models.step.Step`:

  per block and micro-batch   compute.block_seconds (GEMMs, attention, memory-bound kernels,
                              recomputation; an MoE block's routed experts as the busiest rank's
                              grouped GEMMs), comm.tp_block_seconds (Megatron's f/g all-reduces),
                              comm.cp_block_seconds (context-parallel KV exchange),
                              moe.ep_block_seconds (expert-parallel dispatch and combine)
  per stage                   pipeline.stage_seconds (blocks x per block, embedding on the first
                              rank: compute.embedding_seconds, head and loss on the last:
                              compute.head_seconds)
  per step                    pipeline.schedule_seconds (m x slowest stage + bubble),
                              comm.pp_p2p_seconds, comm.dp_comm_seconds (exposed data-parallel / ZeRO
                              traffic; routed experts over the expert data-parallel group:
                              moe.rank_params), compute.optimizer_step_seconds, offload.activation_offload_step_seconds,
                              host.host_wait_seconds (never faster than the host issues:
                              per operation where a pipeline syncs, else the step),
                              host.optimizer_with_host_seconds,
                              moe.host_sync_seconds (dropless MoE layers the host must issue in step)
  memory                      memory.activation_bytes, memory.peak_over_ranks (memory.rank_memory of
                              the first and last rank, or of every rank of an uneven split),
                              memory.fits / memory.needed_bytes (the one "fits")
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Mapping

import numpy as np

from cost_models import comm as C
from cost_models import compute as K
from cost_models import host as H
from cost_models import memory as M
from cost_models import moe as MO
from cost_models import offload as O
from cost_models import pipeline as PL
from cost_models import timeline as TL
from cost_models.flops import model_flops_per_step
from cost_models.step import Software, Step, take_rows
from hardware_profiles import HardwareProfile
from planner.errors import ConfigError
from planner.software import software_for
from planner.spec import TransformerSpec
from planner.parallel import SCHEDULES


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
    cp: np.ndarray | None = None
    """Context-parallel degree; None means 1."""
    cp_comm: np.ndarray | None = None
    """Index into planner.parallel.CP_COMMS; None means p2p (ring)."""
    dp_shard: np.ndarray | None = None
    """ZeRO shard group (0 or dp: all dp ranks); None means 0."""
    ep: np.ndarray | None = None
    """Expert-parallel degree (planner.parallel.expert_parallel_ok); None means 1."""
    expert_tp: np.ndarray | None = None
    """Expert tensor-parallel degree; None means 1."""
    recompute_layers: np.ndarray | None = None
    """With full recomputation, blocks recomputed per pipeline chunk (0: all); None means all."""
    rank_recomputed: np.ndarray | None = None
    """With rank_blocks and recompute_layers: blocks each pipeline rank recomputes (the sum over its chunks of
    min(recompute_layers, chunk)), shape (candidates, R); None: from the even split (exact for it)."""
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
            if f.name in ("rank_blocks", "rank_recomputed"):
                width = max(np.atleast_2d(x).shape[1] for x in values)
                values = [
                    np.pad(
                        np.atleast_2d(x),
                        ((0, 0), (0, width - np.atleast_2d(x).shape[1])),
                        constant_values=-1,
                    )
                    for x in values
                ]
            out[f.name] = np.concatenate(values)
        return cls(**out)


@dataclass(frozen=True, kw_only=True, slots=True)
class Scores:
    """Per-candidate results (arrays). Times in seconds per optimizer step, bytes per GPU."""

    step_time_s: np.ndarray
    peak_bytes_per_gpu: np.ndarray
    capacity_bytes: float
    fits: np.ndarray
    """The one "fits" (cost_models.memory.fits): needed_bytes <= capacity_bytes."""
    needed_bytes: np.ndarray
    """What the device must hold: peak x (1 + the allocator's overhead) + CUDA context
    (cost_models.memory.needed_bytes)."""
    params_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    other_bytes: np.ndarray
    saved_activations_bytes: np.ndarray
    """Activations the peak rank holds at the end of its forward (RankMemory.saved), at any peak moment."""
    compute: np.ndarray
    """Forward + backward (+ recompute) of the slowest stage over all micro-batches, without TP comm."""
    recompute: np.ndarray
    """Part of `compute` spent re-running forwards."""
    tp_comm: np.ndarray
    cp_comm: np.ndarray
    """Exposed context-parallel key/value exchange (cost_models.comm.cp_block_seconds)."""
    ep_comm: np.ndarray
    """Exposed expert-parallel dispatch and combine (cost_models.moe.ep_block_seconds), with the
    interference of its overlapped part."""
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
    bubble_bound: np.ndarray | float = 0.0
    """Pipeline idle time that neither the closed form nor the simulated step goes below
    (cost_models.pipeline.bubble_lower_bound): the search's bound term in place of `bubble`."""
    dp_bound: np.ndarray | float = 0.0
    """Data-parallel time after the compute that neither the closed form nor the simulated step
    goes below, beyond bubble_bound and pp_p2p_bound (never above dp_comm; _pipeline_bounds)."""
    pp_p2p_bound: np.ndarray | float = 0.0
    """Pipeline sends on every rank's stream that neither the closed form nor the simulated step
    goes below: m blocking sends (every rank sends each micro-batch's activation or gradient), 0
    where the interleaved schedule overlaps them (Software.overlap_p2p)."""
    ep_bound: np.ndarray | float = 0.0
    """Expert-parallel time no step goes below: m x the busiest rank's blocks x a block's exposed
    dispatch and combine (cost_models.moe.ep_block_seconds), the part of `ep_comm` (m x the slowest
    stage's share) that every step of the candidate runs on the busiest rank's stream, beside the
    compute that compute + tp_comm + cp_comm count (Narayanan et al. 2021, Sec. 2.2: the slowest
    rank sets the pace); never above ep_comm, since the slowest stage is at least the busiest."""
    sp_off_floor: np.ndarray | float = 0.0
    """What compute + tp_comm of the candidate's twin with sequence parallelism off (same row,
    placement and recompute) never go below: m x the busiest rank's blocks x (a block's compute +
    its forward tensor-parallel collectives before any overlap, comm.TpSeconds.fwd). compute +
    tp_comm is m x the slowest stage less its cp and ep shares, at least m x the busiest rank's
    blocks x (block + exposed tp); without sequence parallelism a block computes no less (its
    norms and dropouts unsharded), nothing overlaps its forward collectives (comm.tp_overlapped)
    and they move no fewer bytes (the pair's volume is the all-reduce's, less under FP8 gathers).
    The search skips scoring a twin whose floor is not below the threshold
    (planner.search.branch_and_bound._admissible)."""
    stage_memory: dict | None = None
    """With CandidateArrays.rank_blocks: per pipeline rank, shape (candidates, R), NaN past pp:
    peak_bytes, params_bytes, grads_bytes, optimizer_bytes, activations_bytes, other_bytes."""
    step: Step | None = None
    """The Step record the terms read (planner.estimate's expert-parallel summary reads it again)."""
    timeline: TL.StepTimeline | None = None
    """With timeline_scores: the simulated step (cost_models.timeline) the step was read off."""
    closed_form_step_s: np.ndarray | None = None
    """With timeline_scores: the closed form's step time (the search's ranking and bound)."""

    BREAKDOWN = (
        "compute",
        "tp_comm",
        "cp_comm",
        "ep_comm",
        "dp_comm",
        "pp_p2p",
        "bubble",
        "optimizer",
        "offload",
        "host_wait",
    )
    """Terms that add up to step_time_s."""
    COMM_TERMS = ("tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_p2p")
    """The BREAKDOWN terms that are communication the step waits for (the rest of each transfer
    is hidden under compute on the simulated timeline, cost_models.timeline)."""


def block_terms(x: Step, *, rows="auto") -> tuple:
    """The per-block terms of one micro-batch: the block's compute (cost_models.compute.block_seconds), its
    tensor-, context- and expert-parallel collectives (cost_models.comm, cost_models.moe), the exposed tensor-parallel
    time, the embedding and the head. They read only the columns Step.block_rows keys, so they are evaluated once per
    distinct row of those and gathered back (`rows`: "auto" for Step.block_rows, None for every candidate, or a
    (first, inverse) pair; a search chunk has some 3 to 50 times fewer such rows than candidates): the same
    numbers in about a fifth less time per chunk."""
    if isinstance(rows, str):
        rows = x.block_rows()
    u = x.take(rows[0]) if rows is not None else x
    block, tp = K.block_seconds(u), C.tp_block_seconds(u)
    out = (
        block,
        tp,
        C.cp_block_seconds(u, block.attn_fwd, block.attn_bwd),
        MO.ep_block_seconds(u, block),
        C.tp_exposed_seconds(u, tp, block),
        K.embedding_seconds(u, tp.allreduce),
        K.head_seconds(u),
    )
    if rows is None:
        return out
    n = len(rows[0])
    return tuple(
        take_rows(np.full(n, float(t)) if isinstance(t, (int, float)) else t, rows[1], n)
        for t in out
    )


def score(
    model,
    hw: HardwareProfile,
    cands: CandidateArrays | Mapping,
    *,
    global_batch: int,
    seq: int,
    precision: str = "amp-bf16",
    optimizer: str = "adamw",
    software: Software | None = None,
) -> Scores:
    """Step time and peak memory of every candidate: the composition of the named terms of
    cost_models over one `Step` record (see the module docstring and each term's docstring).
    `software` defaults to the megatron framework profile (the CLI's default)."""
    x, cands = _step_of(
        model,
        hw,
        cands,
        software,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
    )
    t, pipeline = _time_terms(x)
    stage, bubble, pp_p2p = pipeline.stage, pipeline.bubble, pipeline.pp_p2p
    dp_comm = pipeline.dp_comm
    busy, host_wait = t.busy, t.host_wait
    bubble_bound, pp_p2p_bound, dp_bound = _pipeline_bounds(x, cands, pipeline)
    optimizer_s = H.optimizer_with_host_seconds(
        x,
        K.optimizer_step_seconds(x, t.params_rank),
        K.optimizer_params_updated(x, t.params_rank),
        x.blocks_most,
    )
    acts = M.activation_bytes(x)
    offload = _activation_offload_seconds(x, acts, busy + host_wait, t.forward_share)
    memory, per_rank = M.peak_over_ranks(
        x, acts, host_room=M.host_room_bytes(x, t.params_rank.total), rank_blocks=cands.rank_blocks
    )
    device_s = busy + bubble + pp_p2p + dp_comm + optimizer_s + offload
    return Scores(
        step_time_s=device_s + host_wait,
        peak_bytes_per_gpu=memory.peak,
        capacity_bytes=float(hw.memory_bytes),
        fits=M.fits(memory.peak, hw, x.sw),
        needed_bytes=M.needed_bytes(memory.peak, hw, x.sw),
        params_bytes=memory.params,
        grads_bytes=memory.grads,
        optimizer_bytes=memory.optimizer,
        activations_bytes=memory.activations,
        other_bytes=memory.other,
        saved_activations_bytes=memory.saved,
        compute=busy
        * (1.0 - stage.comm_share["tp"] - stage.comm_share["cp"] - stage.comm_share["ep"]),
        recompute=x.m * x.blocks_most * t.block_recompute,
        tp_comm=busy * stage.comm_share["tp"],
        cp_comm=busy * stage.comm_share["cp"],
        ep_comm=busy * stage.comm_share["ep"],
        dp_comm=dp_comm,
        pp_p2p=pp_p2p,
        bubble=bubble,
        optimizer=optimizer_s,
        offload=offload,
        host_wait=host_wait,
        num_microbatches=x.m,
        model_flops_per_step=float(
            model_flops_per_step(model, global_batch * seq, seq=seq, causal_half=True)
        ),
        stage_memory=per_rank,
        step=x,
        pp_p2p_bound=pp_p2p_bound,
        bubble_bound=bubble_bound,
        dp_bound=dp_bound,
        ep_bound=x.m * x.blocks_most * t.ep_s,
        sp_off_floor=x.m * x.blocks_most * t.sp_off_floor_s,
    )


def _step_of(model, hw, cands, software, **workload) -> tuple[Step, CandidateArrays]:
    """The Step record score() composes its terms over, with the candidates as arrays; a model that
    is not a transformer is refused; `software` None: the megatron profile."""
    if not isinstance(model, TransformerSpec):
        raise ConfigError(
            "model",
            getattr(model, "name", type(model).__name__),
            "a transformer (catalog name or HF config); nn.Module factories are profiled, not scored",
        )
    if not isinstance(cands, CandidateArrays):
        cands = CandidateArrays.from_mapping(cands)
    if software is None:
        software = software_for("megatron")
    return Step.of(model, hw, software, cands, **workload), cands


@dataclass(frozen=True, kw_only=True, slots=True)
class _StepTerms:
    """score()'s terms beside the pipeline's (PipelineTerms), per candidate."""

    busy: np.ndarray
    """The slowest stage's compute over the schedule (pipeline.schedule_seconds)."""
    host_wait: np.ndarray
    """The host's issue waits and a dropless MoE layer's host syncs."""
    params_rank: object
    """The parameters of the rank holding the most (moe.rank_params)."""
    block_recompute: np.ndarray
    ep_s: np.ndarray
    """A block's expert-parallel exchange as the step pays it (exposed + interference)."""
    forward_share: np.ndarray
    """The forwards' share of the compute stream (host.forward_share)."""
    sp_off_floor_s: np.ndarray
    """A block's compute and its forward tensor-parallel collectives before any overlap hides them
    (Scores.sp_off_floor)."""


def _time_terms(x: Step) -> tuple[_StepTerms, PipelineTerms]:
    """The compute, host and communication terms of every candidate (the module docstring)."""
    block, tp, cp, ep, tp_exposed, embedding_s, head_s = block_terms(x)
    cp_s = cp.exposed + K.eff(x.hw, "overlap_interference") * (cp.total - cp.exposed)
    ep_s = ep.exposed + K.eff(x.hw, "overlap_interference") * (ep.total - ep.exposed)
    recompute_s = block.recompute + tp.recompute + ep.recompute
    stage = PL.stage_seconds(
        x,
        block.total,
        {"tp": tp_exposed, "cp": cp_s, "ep": ep_s},
        embedding_s,
        head_s,
        recompute_s=recompute_s,
    )
    busy, bubble = PL.schedule_seconds(x, stage)
    forward_s = _block_forward_seconds(x, block, tp, cp_s, ep, ep_s)
    rank_fwd_s = (
        x.blocks_most * forward_s
        + TL.EMBEDDING_FORWARD_SHARE * embedding_s
        + np.where(x.single_stage, TL.HEAD_FORWARD_SHARE * head_s, 0.0)
    )
    # the host's waits lengthen the compute that data-parallel and offload copies run beside
    rank_ops = dict(fwd_s=rank_fwd_s, bwd_s=stage.slowest - rank_fwd_s, last=x.single_stage)
    host_issue = H.host_wait_seconds(x, **rank_ops)
    host_wait = host_issue + MO.host_sync_seconds(x, block.fwd + tp.fwd + ep.fwd)
    params_first = MO.rank_params(x, x.blocks_first, True, x.single_stage)
    params_rank = params_first.higher(MO.rank_params(x, x.blocks_last, x.single_stage, True))
    hop = C.pp_hop_seconds(x)
    pp_p2p = C.pp_p2p_seconds(x, hop)
    dp_comm = C.dp_comm_seconds(
        x,
        params_rank,
        # a backward lasts as long as the host takes to issue it, if longer (cost_models.host)
        last_backward_s=np.maximum(
            x.blocks_most * (block.bwd + block.recompute + tp.bwd + tp.recompute),
            H.rank_host_seconds(x, last=x.single_stage)[1],
        ),
        compute_s=x.m * x.blocks_most * block.total + host_wait,
        forward_s=x.blocks_most * forward_s,
        # the host's issue waits stretch the compute stream; a dropless MoE layer's host sync
        # is not on it (cost_models.moe.layers_sync_host)
        compute_end_s=busy + bubble + pp_p2p + host_issue,
    )
    pipeline = PipelineTerms(
        stage=stage,
        bubble=bubble,
        pp_p2p=pp_p2p,
        hop=hop,
        dp_comm=dp_comm,
        params_first=params_first,
        forward_s=forward_s,
        second_compute_s=x.blocks_second * (block.fwd + block.bwd),
        per_block_s=block.total + tp_exposed + cp_s + ep_s,
        recompute_s=recompute_s,
        embedding_s=embedding_s,
        head_s=head_s,
    )
    terms = _StepTerms(
        busy=busy,
        host_wait=host_wait,
        params_rank=params_rank,
        block_recompute=block.recompute,
        ep_s=ep_s,
        forward_share=H.forward_share(x, **rank_ops),
        sp_off_floor_s=block.total + tp.fwd,
    )
    return terms, pipeline


def _activation_offload_seconds(x: Step, acts, stream_s, fwd_share) -> np.ndarray:
    """Exposed activation offload of the rank holding the most: its offloaded share of the m
    micro-batches' activations, copied under the forwards and back under the backwards of the
    compute stream (`stream_s`, each operation as long as the longer of its device and host time;
    `fwd_share` the forwards' part, cost_models.host.forward_share)."""
    volume = (
        x.m
        * np.maximum(
            x.blocks_first * acts.block + acts.embedding, x.blocks_last * acts.block + acts.head
        )
        * O.offloaded_share(x, np.maximum(x.blocks_first, x.blocks_last))
    )
    return O.activation_offload_step_seconds(
        x, volume, stream_s * fwd_share, stream_s * (1.0 - fwd_share)
    )


def _block_forward_seconds(x: Step, block, tp, cp_s, ep, ep_s):
    """A block's forward with its exposed tp, cp and ep time: what the simulated step's forward
    operations cost per block (cost_models.timeline.block_terms_of's block_fwd_s)."""
    tp_fwd = C.tp_exposed_parts(x, tp, block)[0]
    ep_fwd = ep_s * ep.fwd / np.maximum(ep.total, 1e-30)
    return block.fwd + tp_fwd + TL.CP_FORWARD_SHARE * cp_s + ep_fwd


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineTerms:
    """score()'s terms of each candidate that the pipeline's lower bounds read (_pipeline_bounds):
    the stage record (pipeline.stage_seconds), the closed form's bubble, sends, one hop and
    data-parallel time, the first rank's parameters, and per-block / per-pass seconds."""

    stage: object
    bubble: np.ndarray
    pp_p2p: np.ndarray
    hop: np.ndarray
    dp_comm: np.ndarray
    params_first: object
    forward_s: np.ndarray
    """One block's forward with its exposed communication (_block_forward_seconds)."""
    second_compute_s: np.ndarray
    """The second rank's blocks' forward and backward compute."""
    per_block_s: np.ndarray
    recompute_s: np.ndarray
    embedding_s: np.ndarray
    head_s: np.ndarray


@dataclass(frozen=True, kw_only=True, slots=True)
class _OrderChains:
    """The fixed orders' chains (_pipeline_bounds' docstring) and what rank 0's stream reads."""

    chains: list
    """(lower bound on the step, blocking sends on it) of the last, a middle and the first rank."""
    longest: np.ndarray
    rank0_end: np.ndarray
    rank0_work_s: np.ndarray
    rank0_forward_s: np.ndarray
    chunks: np.ndarray
    fixed: np.ndarray


def _pipeline_bounds(x: Step, cands: CandidateArrays, t: PipelineTerms):
    """(Scores.bubble_bound, Scores.pp_p2p_bound, Scores.dp_bound): the pipeline's idle time, its
    blocking sends and the data-parallel time after the compute that neither the closed form nor the
    simulated step (cost_models.timeline) goes below, beyond m x the slowest stage. The first two
    are the largest of some lower bounds on the simulated compute end, each read
    off one rank r of the fixed orders (GPipe, 1F1B, interleaved; 0 for zero-bubble, whose greedy
    order may defer the weight gradients into the drain, Qi et al. 2023), with F_q, B_q and S_q =
    F_q + B_q rank q's forward, backward and whole work per micro-batch, v the chunks (1 unless
    interleaved), m the micro-batches, F and B the sums over ranks:

    - the last rank (pipeline.bubble_lower_bound): its m micro-batches run between the fill
      (chunk 0's forwards on ranks 0 .. p-2) and the drain (their backwards):
      m S_last + (B + F - S_last)/v.
    - rank r's first backward (micro-batch 0, chunk v-1, stage (v-1) p + r) waits for its forward
      through all p v stages (F) and its backward from the last stage down to stage (v-1) p + r + 1
      (sum over q > r of B_q / v); then rank r still runs all its work but the k_r forwards it ran
      before (k_r = min(warm-up + 1, m v); warm-up: GPipe all, 1F1B p - r - 1, interleaved
      2 (p - r - 1) + (v - 1) p; cost_models.timeline._FixedOrders); its last operation is the last
      micro-batch's backward of chunk 0 (stage r), which the backwards of stages r - 1 .. 0 follow
      (sum over q < r of B_q / v). So the step is at least
          F + (B - B_r)/v + m S_r - k_r F_r / v,
      read for rank 0 and, with an even split, for the last middle rank that holds the most blocks
      (Step.rank_block_counts). B - B_r >= (p S_mean - S_r) - (F - F_r): only the forwards (their
      share of a block: _block_forward_seconds) need splitting out.

    A rank's blocking sends lie on these chains: the last rank's m backward sends and, for a middle
    rank, its m v; rank 0's chain holds 2 (p - 1) sends of micro-batch 0 and its forwards' sends
    after its first backward, at least m in all (1F1B, interleaved; GPipe 2 (p - 1)). And every
    rank's stream holds m blocking sends, a middle rank 2 m (it sends forward and back, Megatron's
    send_forward_recv_backward), so the step is also at least m S_slowest + m hop and
    m (S_mid + 2 hop), S_mid at least the second rank's blocks' compute (an even split's middle
    rank, p >= 3). The bubble term is the largest chain beyond m S_slowest, never above the closed
    form's `bubble`; the send term the largest chain with its sends beyond that, never above the
    closed form's pp_p2p, 0 where the interleaved schedule overlaps its sends
    (Software.overlap_p2p).

    Rank 0's data-parallel stream (cost_models.timeline.rank_work, _rank_span): chunk c's share R/v
    of its once-per-step reduction R is released at that chunk's last backward, after which rank 0
    runs at most c p + 1 backwards (its cool-down ends with the last round's chunks c, .., 0), so
    the stream ends at least (c + 1) R/v - min(m v, c p + 1) B_0/v after the bound on rank 0's
    compute end (read for c = 0 and v - 1; all of R after it without overlap_grad_reduce), plus the
    parameter gather after the step where it is not overlapped; the rank ends at compute end + (1 -
    i) x that exposed time + i x its whole data-parallel time (i: overlap_interference, what hidden
    communication still costs), both bounds only grow the end. The term is what that exceeds the
    other chains by, never above the closed form's dp_comm; 0 for ZeRO-3 (per micro-batch
    reductions).

    Ranks that share cores (a CPU profile, shared_cores_speedup > 1) keep the last rank's bound and
    no data-parallel term. tests/test_timeline.py checks the terms under the simulated step."""
    busy = x.m * t.stage.slowest
    middle = (x.pp >= 3) & (cands.blocks_first is None)
    chains = [  # (lower bound on the step with its sends, sends on it)
        (busy, x.m),
        (np.where(middle, x.m * t.second_compute_s, -np.inf), 2.0 * x.m),
    ]
    if K.eff(x.hw, "shared_cores_speedup") > 1.0:
        bubble_bound = PL.bubble_lower_bound(x, t.stage, t.bubble)
        chains[0] = (busy + bubble_bound, x.m)
        pp_p2p_bound = _send_bound(x, t, chains, busy, bubble_bound)
        return bubble_bound, pp_p2p_bound, np.zeros(np.shape(busy))
    orders = _order_chains(x, cands, t)
    bubble_bound = np.where(
        orders.fixed, np.minimum(t.bubble, np.maximum(0.0, orders.longest - busy)), 0.0
    )
    pp_p2p_bound = _send_bound(x, t, chains + orders.chains, busy, bubble_bound)
    reached = busy + bubble_bound + pp_p2p_bound
    reduced = _rank0_reduced_end(x, t, orders)
    return bubble_bound, pp_p2p_bound, np.minimum(t.dp_comm, np.maximum(0.0, reduced - reached))


def _send_bound(x: Step, t: PipelineTerms, chains: list, busy, bubble_bound) -> np.ndarray:
    """The blocking sends' term: the longest chain with its sends beyond the compute and bubble
    bounds, never above the closed form's pp_p2p; 0 where the interleaved schedule
    overlaps its sends (Software.overlap_p2p)."""
    overlapped = x.is_schedule("interleaved-1f1b") & (x.v > 1) & x.sw.overlap_p2p
    blocking = (
        functools.reduce(np.maximum, [c + n * t.hop for c, n in chains]) - busy - bubble_bound
    )
    return np.where((x.pp > 1) & ~overlapped, np.minimum(t.pp_p2p, np.maximum(0.0, blocking)), 0.0)


def _order_chains(x: Step, cands: CandidateArrays, t: PipelineTerms) -> _OrderChains:
    """The last rank's, rank 0's and the busiest middle rank's chains of the fixed orders
    (_pipeline_bounds' docstring), -inf where they do not apply."""
    p, m = x.pp, x.m
    fixed = (p > 1) & ~x.is_schedule("zero-bubble")
    v = np.where(x.is_schedule("interleaved-1f1b") & (x.v > 1), x.v, 1.0)
    gpipe = x.is_schedule("gpipe")
    f_all = (
        x.spec.total_blocks * t.forward_s
        + TL.EMBEDDING_FORWARD_SHARE * t.embedding_s
        + TL.HEAD_FORWARD_SHARE * t.head_s
    )
    s_all = p * t.stage.mean

    def first_backward(r, s_r, f_r):
        warm = PL.warmup_forwards(p, r, m, v, gpipe=gpipe)
        k = np.minimum(warm + 1.0, m * v)
        return f_all * (1.0 - 1.0 / v) + (s_all - s_r) / v + m * s_r + f_r * (1.0 - k) / v

    s_first = PL.first_rank_seconds(x, t.per_block_s, t.embedding_s, t.head_s, t.recompute_s)
    f_first = (
        x.blocks_first * t.forward_s
        + TL.EMBEDDING_FORWARD_SHARE * t.embedding_s
        + np.where(x.single_stage, TL.HEAD_FORWARD_SHARE * t.head_s, 0.0)
    )
    k_mid = _busiest_middle_rank(x)
    even = cands.blocks_first is None and getattr(cands, "rank_blocks", None) is None
    mid = np.where(
        fixed & even & (k_mid >= 1),
        first_backward(k_mid, x.blocks_most * t.per_block_s, x.blocks_most * t.forward_s),
        -np.inf,
    )
    last = np.where(fixed, m * t.stage.last + (s_all - t.stage.last) / v, -np.inf)
    rank0_end = first_backward(0.0, s_first, f_first)
    rank0 = np.where(fixed, rank0_end, -np.inf)
    rank0_sends = np.where(gpipe, np.minimum(m, 2.0 * (p - 1.0)), m)
    return _OrderChains(
        chains=[(last, m), (mid, m), (rank0, rank0_sends)],
        longest=np.maximum(np.maximum(last, rank0), mid),
        rank0_end=rank0_end,
        rank0_work_s=s_first,
        rank0_forward_s=f_first,
        chunks=v,
        fixed=fixed,
    )


def _busiest_middle_rank(x: Step) -> np.ndarray:
    """The last rank of an even split that holds the most blocks (Step.rank_block_counts), if a
    middle one: ranks k <= r - (ceil(r / p) - 1) p - 1 hold v q + ceil(r / p), r = L mod p v."""
    p = x.pp
    q = np.floor(x.spec.total_blocks / (p * x.v))
    rest = x.spec.total_blocks - q * p * x.v
    most = np.where(rest > 0, rest - (np.ceil(rest / p) - 1.0) * p - 1.0, p - 1.0)
    return np.minimum(most, p - 2.0)


def _rank0_reduced_end(x: Step, t: PipelineTerms, orders: _OrderChains) -> np.ndarray:
    """Rank 0's end with its data-parallel stream (cost_models.timeline.rank_work, _rank_span): its
    gradient reduction (ZeRO-3's per micro-batch ones left out) chunk by chunk after each chunk's
    last backward, its parameter gather after the step where not overlapped, and the interference
    of the hidden part."""
    p, m, v = x.pp, x.m, orders.chunks
    allreduce, reduce_scatter, gather = C.dp_reduction_parts(x, t.params_first)
    bf16 = x.sw.bf16_optimizer
    once = np.where(x.zero >= 3, 0.0, np.where((x.zero == 0) | bf16, allreduce, reduce_scatter))
    gather = np.where((x.zero >= 3) | ((x.zero == 0) & (not bf16)), 0.0, gather)
    b_first = orders.rank0_work_s - orders.rank0_forward_s
    if x.sw.overlap_grad_reduce:
        # after chunk c's last backward rank 0 runs at most c p + 1 backwards (its cool-down ends
        # with the last round's chunks c, c - 1, .., 0) and the stream (c + 1) reductions of
        # once / v: read for c = 0 and c = v - 1
        exposed = np.maximum(
            np.maximum(0.0, once - b_first) / v,
            once - np.minimum(m * v, (v - 1.0) * p + 1.0) * b_first / v,
        )
    else:
        exposed = once
    if not (x.sw.overlap_param_gather and x.sw.overlap_grad_reduce and not bf16):
        exposed = exposed + gather
    i = K.eff(x.hw, "overlap_interference")
    start = np.where(orders.fixed | x.single_stage, orders.rank0_end, -np.inf)
    return start + (1.0 - i) * exposed + i * (once + gather)


_DEADLOCKED_ORDERS: set[tuple[str, int, int, int]] = set()
"""(schedule, micro-batches, chunks, pipeline ranks) of the fixed orders that deadlock
(cost_models.timeline.OrderDeadlock). Whether one does depends on these alone (an operation waits
for its input to be placed, whatever the durations), and a deadlock is found only after most of
the step is placed and is not cached by TL.simulate (an exception): a search documents ~10 leaders,
often several of one order (GPT-3 175B on 960 A100s: 8 deadlocked runs of ~40 ms each)."""


def timeline_scores(scores: Scores) -> Scores:
    """`scores` of one candidate (estimate's length-1 arrays) with the step time and its breakdown
    read off the simulated step (cost_models.timeline): the critical rank's compute (split into
    compute, tp, cp and ep by the per-block terms' shares, as the closed form splits it), its
    blocking pipeline sends and the interference of its overlapped ones, its idle time (bubble), its
    data-parallel time after its compute (with the interference of the hidden part and the tied
    embedding's sync), then the optimizer step, offload and host terms the closed form costs.
    Memory is unchanged."""
    x = scores.step
    if np.size(x.dp) != 1:
        raise ValueError(f"timeline_scores takes one candidate, got {np.size(x.dp)}")

    order = tuple(
        int(np.asarray(a, dtype=float).reshape(-1)[0])
        for a in (x.schedule, np.round(x.m), x.v, x.pp)
    )
    order = (SCHEDULES[order[0]], *order[1:])
    if order in _DEADLOCKED_ORDERS:
        return replace(scores, closed_form_step_s=np.asarray(scores.step_time_s, float))
    block, tp, cp, ep, tp_exposed, embedding_s, head_s = block_terms(x, rows=None)
    terms = TL.block_terms_of(x, block, tp, cp, ep, embedding_s, head_s)
    try:
        tl = TL.simulate(TL.step_work(x, terms))
    except TL.OrderDeadlock:
        # an interleaved order with a partial last round of micro-batches that the fixed order
        # cannot run (Megatron-Core's own table for it is not modelled yet): the closed form
        _DEADLOCKED_ORDERS.add(order)
        return replace(scores, closed_form_step_s=np.asarray(scores.step_time_s, float))
    rank = tl.ranks[tl.critical]
    optimizer_s = np.asarray(scores.optimizer, float)
    offload_s = np.asarray(scores.offload, float)
    after_s = TL.after_reduction_seconds(x)
    device_s = tl.makespan_s + after_s + optimizer_s + offload_s
    # the host's issue time is on the timeline (cost_models.host); MoE's per-layer syncs are not
    host_sync = MO.host_sync_seconds(x, block.fwd + tp.fwd + ep.fwd)
    i = K.eff(x.hw, "overlap_interference")
    per_block = np.maximum(terms.block_total_s, 1e-30)
    shares = {
        "tp": tp_exposed / per_block,
        "cp": (cp.exposed + i * (cp.total - cp.exposed)) / per_block,
        "ep": (ep.exposed + i * (ep.total - ep.exposed)) / per_block,
    }
    busy = rank.busy_s
    p2p = rank.hops_s + i * rank.hidden_hops_s
    # a difference of times: clamp the rounding residue (-1e-18 s would make the plan unloadable)
    dp = max(
        0.0, rank.end_s - rank.compute_end_s + rank.gate_wait_s + after_s - (p2p - rank.hops_s)
    )
    return replace(
        scores,
        step_time_s=device_s + host_sync,
        compute=busy * (1.0 - sum(shares.values())),
        tp_comm=busy * shares["tp"],
        cp_comm=busy * shares["cp"],
        ep_comm=busy * shares["ep"],
        dp_comm=np.asarray([dp]),
        pp_p2p=np.asarray([p2p]),
        bubble=np.asarray([rank.bubble_s]),
        optimizer=optimizer_s,
        offload=offload_s,
        host_wait=rank.host_wait_s + host_sync,
        timeline=tl,
        closed_form_step_s=np.asarray(scores.step_time_s, float),
    )
