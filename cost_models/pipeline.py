"""Pipeline schedules: bubble and in-flight micro-batches (numbers or numpy arrays).

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM"), Sec. 2.2: with p stages and m micro-batches, GPipe and 1F1B idle for
(p - 1) micro-batch slots per step, a bubble fraction of (p - 1) / m of the ideal time (eq. 1);
the interleaved schedule with v model chunks per device cuts it to (p - 1) / (v m) (eq. 2).
Zero-bubble ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", Sec. 3.1) splits the
backward into input and weight gradients and fills the warm-up/cool-down with weight-gradient work,
leaving about 1/3 of 1F1B's bubble at 1F1B's memory.

Fewer micro-batches than stages (m < p): the GPipe/1F1B bubble stays (p - 1) slots, but the two
refinements lose part of their gain. Interleaving feeds each chunk's pass with only m of the p
micro-batches a round needs, so a rank idles (p - m) chunk slots at each of its v - 1 chunk
transitions: (p - 1)/v + (p - m)(v - 1)/v. ZB-H1 has only m weight-gradient passes to fill the
cool-down: (p - 1)/3 + (p - m)/3. Both are what the schedules' op orders give under a list
scheduler (planner.report.timeline; tests/test_report_timeline.py checks every m).

Activation memory: GPipe keeps all m micro-batches; 1F1B's stage k (0-based) keeps min(p - k, m),
the first stage p (Narayanan et al. 2021, Sec. 2.2.1); interleaved 1F1B's first stage keeps
p (1 + (p - 1) / (p v)) stage-loads (Korthikanti et al. 2022, Sec. 4.2.3), its rank k
((p - k - 1) 2 + (v - 1) p + 1)/v (inflight_microbatches).
"""

from __future__ import annotations

import numpy as np

from cost_models.compute import eff
from planner.parallel import SCHEDULES

SCHEDULE_BUBBLE_SCALE = {
    "gpipe": 1.0,
    "1f1b": 1.0,
    "interleaved-1f1b": None,
    "zero-bubble": 1.0 / 3.0,
}
"""Bubble relative to 1F1B's (p - 1) slots; interleaved divides by v."""


def bubble_slots(
    schedule_idx, pp, virtual_stages, schedules: tuple[str, ...], num_microbatches=np.inf
):
    """Idle micro-batch slots per step, in units of one stage's (forward + backward) time:
    (p - 1) for GPipe/1F1B, (p - 1)/v interleaved, (p - 1)/3 zero-bubble; the last two grow by
    (p - m)(v - 1)/v and (p - m)/3 when m < p (module docstring)."""
    pp = np.asarray(pp, dtype=float)
    v = np.asarray(virtual_stages, dtype=float)
    short = np.maximum(0.0, pp - np.asarray(num_microbatches, dtype=float))
    schedule_idx = np.asarray(schedule_idx)
    slots = (pp - 1.0) * np.ones(np.broadcast(schedule_idx, pp, v, short).shape)
    for i, name in enumerate(schedules):
        k = SCHEDULE_BUBBLE_SCALE[name]
        if k is None:
            slots = np.where(schedule_idx == i, (pp - 1.0) / v + short * (v - 1.0) / v, slots)
        elif k != 1.0:
            slots = np.where(schedule_idx == i, ((pp - 1.0) + short) * k, slots)
    return slots


def bubble_fraction(schedule: str, pp, num_microbatches, virtual_stages=1):
    """Bubble time over ideal time: bubble_slots / m; for m >= p (p - 1)/m, (p - 1)/(v m)
    interleaved, a third of 1F1B's for ZB-H1."""
    names = tuple(SCHEDULE_BUBBLE_SCALE)
    return bubble_slots(
        names.index(schedule), pp, virtual_stages, names, num_microbatches
    ) / np.asarray(num_microbatches, dtype=float)


def inflight_microbatches(schedule_idx, pp, num_microbatches, virtual_stages, rank, schedules):
    """Micro-batches whose block activations pipeline rank `rank` (0-based) holds at its peak, in
    units of its whole stage (all its chunks):

        GPipe                 m (all forwards before any backward; Huang et al. 2019)
        1F1B, ZB-H1           min(p - k, m) (Narayanan et al. 2021, Sec. 2.2.1; ZB-H1 keeps
                              1F1B's in-flight count, Qi et al. 2023, Sec. 3.1)
        interleaved (v > 1)   min(((p - k - 1) 2 + (v - 1) p + 1) / v, m): Megatron's warm-up of
                              (p - k - 1) 2 + (v - 1) p chunk passes plus the one in progress, each
                              1/v of the stage (Narayanan et al. 2021, Sec. 2.2.2); for k = 0 this is
                              Korthikanti et al. 2022's p (1 + (p - 1)/(p v)), Sec. 4.2.3.
        no pipeline (p = 1)   1 (micro-batches accumulate one after the other).

    tests/test_cost_pipeline.py checks these against the op orders of planner.report.timeline."""
    pp = np.asarray(pp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    v = np.asarray(virtual_stages, dtype=float)
    k = np.asarray(rank, dtype=float)
    schedule_idx = np.asarray(schedule_idx)
    inflight = np.minimum(pp - k, m)
    for i, name in enumerate(schedules):
        if name == "gpipe":
            inflight = np.where(schedule_idx == i, m, inflight)
        elif name == "interleaved-1f1b":
            looped = np.minimum(((pp - k - 1.0) * 2.0 + (v - 1.0) * pp + 1.0) / v, m)
            inflight = np.where((schedule_idx == i) & (v > 1), looped, inflight)
    return np.where(pp > 1, inflight, np.minimum(1.0, m))


def inflight_microbatches_first_stage(
    schedule_idx, pp, num_microbatches, virtual_stages, schedules
):
    """inflight_microbatches of rank 0: GPipe m; 1F1B and ZB-H1 min(p, m); interleaved
    min(p (1 + (p - 1)/(p v)), m) (Korthikanti et al. 2022, Sec. 4.2.3)."""
    return inflight_microbatches(schedule_idx, pp, num_microbatches, virtual_stages, 0, schedules)


def inflight_microbatches_last_stage(schedule_idx, num_microbatches, schedules):
    """The LM head and loss (last chunk of the last rank): the 1F1B family runs each micro-batch's
    backward right after its forward there, so 1; GPipe keeps all m. The last rank's blocks keep
    inflight_microbatches(rank = p - 1): 1 except interleaved ((v - 1) p + 1)/v."""
    m = np.asarray(num_microbatches, dtype=float)
    out = np.minimum(1.0, m) * np.ones(np.broadcast(schedule_idx, m).shape)
    for i, name in enumerate(schedules):
        if name == "gpipe":
            out = np.where(np.asarray(schedule_idx) == i, m, out)
    return out


def warmup_forwards(p, rank, microbatches, chunks, *, gpipe):
    """Forwards a pipeline rank runs before its first backward in the fixed orders: GPipe all
    m v of them; 1F1B p - r - 1 (Narayanan et al. 2021, Sec. 2.2.1); interleaved 1F1B with v > 1
    chunks (p - r - 1) 2 + (v - 1) p; never more than m v. Arrays broadcast. The one owner of
    the warm-up: cost_models.timeline's fixed orders, comm's overlap of rank 0's gradient
    reductions and planner.score's step bound all read it."""
    n = microbatches * chunks
    steady = np.where(chunks > 1, (p - rank - 1) * 2 + (chunks - 1) * p, p - rank - 1)
    return np.where(gpipe, n, np.minimum(steady, n))


def p2p_transfers_on_critical_path(pp, num_microbatches, virtual_stages):
    """Activation sends (and gradient sends back) serialized with compute in a step: each of the
    m v chunk-passes plus the p - 1 warm-up hops, both directions: 2 (m v + p - 1); 0 when p = 1
    (Megatron's blocking send/recv between stages)."""
    pp = np.asarray(pp, dtype=float)
    return np.where(
        pp > 1, 2.0 * (np.asarray(num_microbatches) * np.asarray(virtual_stages) + pp - 1.0), 0.0
    )


# ------------------------------------------------------------------------ step terms (cost_models.step)

from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSeconds:
    """One micro-batch through pipeline stages (forward + backward + recompute, TP comm included)."""

    slowest: np.ndarray
    """The slowest rank: the schedule's beat (first, last or busiest rank)."""
    mean: np.ndarray
    """Work of the whole model / pp: what an idle slot of the bubble costs."""
    comm_share: dict
    """Per communication term of the blocks (tp, cp): its share of the busiest rank's block time."""
    last: np.ndarray | float = 0.0
    """The last rank (the head and loss, its blocks)."""


def _recompute_unit(share, recompute_s):
    """Seconds of recomputing one block (the busiest rank's `recompute_s` over its share)."""
    return np.where(share > 0, np.asarray(recompute_s, dtype=float) / np.maximum(share, 1e-30), 0.0)


def _end_rank(x, blocks, recomputed, block_s, share, unit, own_s, other_s):
    """A first or last rank's micro-batch: its blocks, the difference its own recomputed blocks
    make, its end of the model (`own_s`) and the other end's too when pp = 1."""
    return (
        blocks * block_s
        + (recomputed - blocks * share) * unit
        + own_s
        + np.where(x.single_stage, other_s, 0.0)
    )


def first_rank_seconds(x, block_s, embedding_s, head_s, recompute_s=0.0):
    """The first rank's micro-batch at `block_s` per block (stage_seconds' first rank)."""
    share = x.full_share
    unit = _recompute_unit(share, recompute_s)
    rec_first = x.recomputed_at_ends()[0]
    return _end_rank(x, x.blocks_first, rec_first, block_s, share, unit, embedding_s, head_s)


def stage_seconds(
    x, per_block_s, per_block_comm_s: dict, embedding_s, head_s, recompute_s=0.0
) -> StageSeconds:
    """Blocks x per-block time (compute + each exposed communication term) on each rank, plus the
    embedding on the first and the head and loss on the last (both on the only stage when pp = 1);
    the slowest rank sets the pace (Narayanan et al. 2021, Sec. 2.2). When only some blocks of each chunk
    are fully recomputed (recompute_layers), the per-block time carries the busiest rank's share of a block's
    recomputation (`recompute_s`, Step.full_share); the first and the last rank add the difference their own
    recomputed blocks make (Step.recomputed_at_ends)."""
    block = per_block_s + sum(per_block_comm_s.values())
    rec_first, rec_last, _ = x.recomputed_at_ends()
    share = x.full_share
    unit = _recompute_unit(share, recompute_s)
    first = _end_rank(x, x.blocks_first, rec_first, block, share, unit, embedding_s, head_s)
    last = _end_rank(x, x.blocks_last, rec_last, block, share, unit, head_s, embedding_s)
    most = x.blocks_most * block
    return StageSeconds(
        slowest=np.maximum(np.maximum(first, last), most),
        mean=(x.spec.total_blocks * block + embedding_s + head_s) / x.pp,
        comm_share={
            k: x.blocks_most * v / np.maximum(most, 1e-30) for k, v in per_block_comm_s.items()
        },
        last=last,
    )


def schedule_seconds(x, stage: StageSeconds):
    """(busy, bubble) seconds of one step: m x the slowest stage, and the schedule's idle slots x the
    mean stage (bubble_slots). Ranks that share cores (a CPU profile, `shared_cores_speedup` > 1) run
    faster while others idle, but a node cannot finish its work sooner than with all ranks busy:
    the busy span becomes max(busy, (busy + bubble) / speedup)."""
    busy = x.m * stage.slowest
    bubble = bubble_slots(x.schedule, x.pp, x.v, SCHEDULES, x.m) * stage.mean
    speedup = eff(x.hw, "shared_cores_speedup")
    if speedup > 1.0:
        bubble = np.maximum(0.0, (busy + bubble) / speedup - busy)
    return busy, bubble


def bubble_lower_bound(x, stage: StageSeconds, bubble):
    """Idle time no simulated step (cost_models.timeline) goes below, beyond m x the slowest stage:
    the last rank runs its m micro-batches between the pipeline's fill (chunk 0's forwards on ranks
    0 .. p-2) and its drain (their backwards), each 1/v of those ranks' work, so the step is at
    least
        m S_last + (p S_mean - S_last) / v    (GPipe, 1F1B, interleaved; Narayanan et al. 2021,
                                               Sec. 2.2)
    and the bound is that beyond m S_slowest, never more than the closed form's `bubble` (which the
    step also includes); 0 for zero-bubble (ZB-H1 may defer the weight gradients into the drain,
    Qi et al. 2023)."""
    ordered = x.m * stage.last + (x.pp * stage.mean - stage.last) / x.v
    lb = np.maximum(0.0, ordered - x.m * stage.slowest)
    return np.where((x.pp > 1) & ~x.is_schedule("zero-bubble"), np.minimum(bubble, lb), 0.0)
