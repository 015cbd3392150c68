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
                              compute.host_wait_seconds (never faster than the host dispatches),
                              moe.host_sync_seconds (dropless MoE layers the host must issue in step)
  memory                      memory.activation_bytes, memory.peak_over_ranks (memory.rank_memory of
                              the first and last rank, or of every rank of an uneven split),
                              memory.fits / memory.needed_bytes (the one "fits")
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

import numpy as np

from cost_models import comm as C
from cost_models import compute as K
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
    bubble_bound: np.ndarray | float = 0.0
    """Pipeline idle time that neither the closed form nor the simulated step goes below
    (cost_models.pipeline.bubble_lower_bound): the search's bound term in place of `bubble`."""
    pp_p2p_bound: np.ndarray | float = 0.0
    """Pipeline sends on every rank's stream that neither the closed form nor the simulated step
    goes below: m blocking sends (every rank sends each micro-batch's activation or gradient), 0
    where the interleaved schedule overlaps them (Software.overlap_p2p)."""
    """6 N tokens + attention, recomputation not counted (the MFU numerator)."""
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
    x = Step.of(
        model,
        hw,
        software,
        cands,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
    )
    block, tp, cp, ep, tp_exposed, embedding_s, head_s = block_terms(x)
    cp_s = cp.exposed + K.eff(hw, "overlap_interference") * (cp.total - cp.exposed)
    ep_s = ep.exposed + K.eff(hw, "overlap_interference") * (ep.total - ep.exposed)
    stage = PL.stage_seconds(
        x,
        block.total,
        {"tp": tp_exposed, "cp": cp_s, "ep": ep_s},
        embedding_s,
        head_s,
        recompute_s=block.recompute + tp.recompute + ep.recompute,
    )
    busy, bubble = PL.schedule_seconds(x, stage)
    params_rank = MO.rank_params(x, x.blocks_first, True, x.single_stage).higher(
        MO.rank_params(x, x.blocks_last, x.single_stage, True)
    )
    dp_comm = C.dp_comm_seconds(
        x,
        params_rank,
        last_backward_s=x.blocks_most * (block.bwd + block.recompute + tp.bwd + tp.recompute),
        compute_s=x.m * x.blocks_most * block.total,
    )
    hop = C.pp_hop_seconds(x)
    pp_p2p = C.pp_p2p_seconds(x, hop)
    bubble_bound = PL.bubble_lower_bound(x, stage, bubble)
    pp_p2p_bound = _pp_p2p_bound(x, cands, block, stage, bubble_bound, pp_p2p, hop)
    optimizer_s = K.optimizer_step_seconds(x, params_rank)
    acts = M.activation_bytes(x)
    host_room = M.host_room_bytes(x, params_rank.total)
    volume = (
        x.m
        * np.maximum(
            x.blocks_first * acts.block + acts.embedding, x.blocks_last * acts.block + acts.head
        )
        * O.offloaded_share(x, np.maximum(x.blocks_first, x.blocks_last))
    )
    fwd_share = (block.fwd + tp.fwd) / np.maximum(block.total + tp.total + cp_s + ep_s, 1e-30)
    offload = O.activation_offload_step_seconds(
        x, volume, busy * fwd_share, busy * (1.0 - fwd_share)
    )
    memory, per_rank = M.peak_over_ranks(
        x, acts, host_room=host_room, rank_blocks=cands.rank_blocks
    )
    device_s = busy + bubble + pp_p2p + dp_comm + optimizer_s + offload
    host_wait = K.host_wait_seconds(x, device_s) + MO.host_sync_seconds(
        x, block.fwd + tp.fwd + ep.fwd
    )
    return Scores(
        step_time_s=device_s + host_wait,
        peak_bytes_per_gpu=memory.peak,
        capacity_bytes=float(hw.memory_bytes),
        fits=M.fits(memory.peak, hw, software),
        needed_bytes=M.needed_bytes(memory.peak, hw, software),
        params_bytes=memory.params,
        grads_bytes=memory.grads,
        optimizer_bytes=memory.optimizer,
        activations_bytes=memory.activations,
        other_bytes=memory.other,
        saved_activations_bytes=memory.saved,
        compute=busy
        * (1.0 - stage.comm_share["tp"] - stage.comm_share["cp"] - stage.comm_share["ep"]),
        recompute=x.m * x.blocks_most * block.recompute,
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
    )


def _pp_p2p_bound(x: Step, cands: CandidateArrays, block, stage, bubble_bound, pp_p2p, hop):
    """Scores.pp_p2p_bound: blocking sends that neither step goes below, beyond m x the slowest
    stage and bubble_bound. Every rank's stream holds m blocking sends (one per micro-batch), a
    middle rank 2 m (it sends forward and back, Megatron's send_forward_recv_backward;
    cost_models.timeline), so the step is at least max(m S_slowest + bubble_bound + m hop,
    m (S_mid + 2 hop)) with S_mid at least the second rank's blocks' compute (an even split's
    middle rank, p >= 3); 0 where the interleaved schedule overlaps its sends. Never above the
    closed form's pp_p2p."""
    overlapped = x.is_schedule("interleaved-1f1b") & (x.v > 1) & x.sw.overlap_p2p
    mid = (
        x.m * (x.blocks_second * (block.fwd + block.bwd) + 2.0 * hop)
        - x.m * stage.slowest
        - bubble_bound
    )
    middle = (x.pp >= 3) & (cands.blocks_first is None)
    blocking = np.maximum(x.m * hop, np.where(middle, mid, 0.0))
    return np.where((x.pp > 1) & ~overlapped, np.minimum(pp_p2p, blocking), 0.0)


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
    block, tp, cp, ep, tp_exposed, embedding_s, head_s = block_terms(x, rows=None)
    terms = TL.block_terms_of(x, block, tp, cp, ep, embedding_s, head_s)
    try:
        tl = TL.simulate(TL.step_work(x, terms))
    except TL.OrderDeadlock:
        # an interleaved order with a partial last round of micro-batches that the fixed order
        # cannot run (Megatron-Core's own table for it is not modelled yet): the closed form
        return replace(scores, closed_form_step_s=np.asarray(scores.step_time_s, float))
    rank = tl.ranks[tl.critical]
    optimizer_s = np.asarray(scores.optimizer, float)
    offload_s = np.asarray(scores.offload, float)
    after_s = TL.after_reduction_seconds(x)
    device_s = tl.makespan_s + after_s + optimizer_s + offload_s
    host_wait = K.host_wait_seconds(x, device_s) + MO.host_sync_seconds(
        x, block.fwd + tp.fwd + ep.fwd
    )
    i = K.eff(x.hw, "overlap_interference")
    per_block = np.maximum(terms.block_total_s, 1e-30)
    shares = {
        "tp": tp_exposed / per_block,
        "cp": (cp.exposed + i * (cp.total - cp.exposed)) / per_block,
        "ep": (ep.exposed + i * (ep.total - ep.exposed)) / per_block,
    }
    busy = rank.busy_s
    p2p = rank.hops_s + i * rank.hidden_hops_s
    dp = rank.end_s - rank.compute_end_s + rank.gate_wait_s + after_s - (p2p - rank.hops_s)
    return replace(
        scores,
        step_time_s=device_s + host_wait,
        compute=busy * (1.0 - sum(shares.values())),
        tp_comm=busy * shares["tp"],
        cp_comm=busy * shares["cp"],
        ep_comm=busy * shares["ep"],
        dp_comm=np.asarray([dp]),
        pp_p2p=np.asarray([p2p]),
        bubble=np.asarray([rank.bubble_s]),
        optimizer=optimizer_s,
        offload=offload_s,
        host_wait=host_wait,
        timeline=tl,
        closed_form_step_s=np.asarray(scores.step_time_s, float),
    )
