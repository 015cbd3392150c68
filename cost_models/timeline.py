"""The timeline of one training step, as the stack schedules it: a small discrete-event loop (issue
32).

The closed form (planner.score) composes a step as m x the slowest stage + bubble + exposed
communication, each "exposed" part assumed. Here the step is simulated instead, for ONE candidate:

- a compute stream per pipeline rank runs the schedule's operations in the schedule's order: forward
  (F) and backward (B) of each micro-batch and model chunk; zero-bubble also splits out the weight
  gradient (W). Each operation starts when its rank is free and its input has arrived (the previous
  stage's F, the next stage's B). Orders: GPipe (Huang et al. 2019, Fig. 2), 1F1B (Narayanan et al.
  2021, Sec. 2.2.1), interleaved 1F1B with v chunks per rank, stage c p + r, warm-up (p - r - 1) 2 +
  (v - 1) p (Narayanan et al. 2021, Sec. 2.2.2; Megatron-Core's
  forward_backward_pipelining_with_interleaving), ZB-H1 (Qi et al. 2023, Sec. 3.1: B first, F while
  fewer than p - r micro-batches are in flight, W in the slots left).
- an operation's duration is the existing per-op cost terms (cost_models.compute, comm, moe): the
  block's compute with its exposed tensor-, context- and expert-parallel time of that pass
  (comm.tp_exposed_parts costs the userbuffers overlap of Megatron-Core's tp_comm_overlap); nothing
  is costed twice here.
- pipeline sends: blocking (Megatron's non-interleaved 1F1B, send_forward_recv_backward; DeepSpeed's
  PipelineEngine) hold the sending rank for the hop and its receiver waits for the end of it;
  overlapped (Megatron-Core's interleaved schedule with overlap_p2p_comm) only delay the receiver by
  the hop (comm.pp_hop_seconds) and cost the interference of hidden communication below.
- a data-parallel stream per rank: with overlap_grad_reduce, each model chunk's gradients are
  reduced bucket by bucket as the chunk's last backward (its W under zero-bubble) produces them
  (Megatron-Core's DistributedDataParallel: a bucket's reduce-scatter is launched when all its
  gradients of the last micro-batch are ready, `overlap_grad_reduce`; docs "distributed optimizer";
  PyTorch DDP's 25 MiB buckets, Li et al. 2020), so in the interleaved schedule the later chunks'
  reductions run under the earlier chunks' cool-down; ZeRO-2 reduce-scatters every micro-batch's
  gradients the same way. With overlap_param_gather (Megatron-Core --overlap-param-gather) the
  distributed optimizer's parameter all-gather runs at the start of the step, chunk by chunk in the
  order the forward uses them, and a chunk's first forward waits only for its first bucket; without
  it the gather follows the optimizer step. ZeRO-3 gathers each operation's parameters while the
  previous operation runs (FSDP's prefetch) and reduce-scatters under its backward. Without
  overlap_grad_reduce every reduction starts after the rank's last backward.
- the rank's step ends when its compute and its reductions are done; communication hidden under
  compute (data-parallel and overlapped pipeline sends) still costs `overlap_interference` of its
  time (NCCL's kernels take SMs and memory bandwidth), as in cost_models.comm.dp_comm_seconds. The
  step is the makespan over ranks plus the per-step work after the reductions that the closed form
  already costs (optimizer step, tied-embedding sync, offload); the exposed part of each
  communication is read off the simulated spans.

A bucket stream released at n evenly spaced times over [s, e], each piece taking d, drains in FIFO
order at max(t0 + n d, s + (e - s)/n + n d, e + d) (t0: when the stream is free): the latest of the
pieces' own release-plus-queue times, exact for a FIFO queue with linear releases, so a bucket
stream is one event.

Engine: plain Python, no library. The operations of a rank are a fixed list (the schedule's order),
and an operation's start depends only on already-finished operations, so a round-robin over ranks
that commits each rank's next operation when its input is known is an exact event loop,
O(operations). A general discrete-event library (SimPy and the like) would add a dependency and a
per-event coroutine cost for nothing the fixed orders need; ZB-H1's greedy choice is the one place
the next event must be picked by time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from cost_models import comm as C
from cost_models import moe as MO
from cost_models.compute import eff
from planner.parallel import SCHEDULES


class OrderDeadlock(RuntimeError):
    """A fixed schedule order whose next operations all wait on each other (the interleaved order
    with a partial last round of micro-batches, for some p, m and v)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankWork:
    """One pipeline rank's work in one step, seconds (from the per-op cost terms)."""

    fwd_s: float
    """Forward of one micro-batch through all the rank's chunks (compute and its exposed tp, cp, ep
    time)."""
    bwd_s: float
    """Backward of one micro-batch (with recomputation)."""
    weight_grad_fraction: float = 0.5
    """Share of bwd_s that is the weight gradient W (zero-bubble); Qi et al. 2023 take B ~ W."""
    reduce_s: float = 0.0
    """The gradients' reduction once per step: all-reduce (ZeRO-0) or reduce-scatter (ZeRO 1-2)."""
    micro_reduce_s: float = 0.0
    """Reduce-scatter after each other micro-batch's backward (ZeRO-2), or after every one
    (ZeRO-3)."""
    gather_s: float = 0.0
    """The distributed optimizer's parameter all-gather once per step (ZeRO 1-2)."""
    micro_gather_s: float = 0.0
    """ZeRO-3: all-gather of the parameters before each micro-batch's forward and again before its
    backward."""
    buckets: int = 1
    """Gradient buckets per model chunk."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepWork:
    """What one step runs: the schedule, the ranks' work and the stack's overlaps."""

    schedule: str
    microbatches: int
    chunks: int
    ranks: tuple[RankWork, ...]
    hop_s: float = 0.0
    """One pipeline send of an activation or its gradient."""
    blocking_p2p: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    interference: float = 0.0
    """Share of hidden communication time that still slows the compute it runs beside."""
    compute_speedup: float = 1.0
    """Ranks sharing cores (CPU profiles): how much faster a rank runs while others idle."""


class Op(NamedTuple):
    """One operation on one rank's compute stream (a tuple: the loop makes thousands)."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RankSpan:
    """What one rank's step was made of, read off the timeline, seconds."""

    busy_s: float
    """Compute (the operations' own durations, without blocking sends)."""
    hops_s: float
    """Blocking pipeline sends on this rank's compute stream."""
    hidden_hops_s: float = 0.0
    """Overlapped pipeline sends of this rank (they cost interference x their time)."""
    compute_end_s: float
    gate_wait_s: float
    """Time the first forward waited for its parameters (overlap_param_gather)."""
    dp_total_s: float
    dp_exposed_s: float
    """Data-parallel time after the compute ended (and the gather after the optimizer without
    overlap)."""
    end_s: float
    """compute_end + dp_exposed + interference x hidden."""

    @property
    def bubble_s(self) -> float:
        return max(0.0, self.compute_end_s - self.busy_s - self.hops_s - self.gate_wait_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeline:
    ranks: tuple[RankSpan, ...]
    raw_ops: tuple[tuple, ...]
    """Every operation as a plain (rank, kind, micro-batch, chunk, start_s, end_s) tuple (cheap to
    make in the loop; `ops` names the fields)."""

    @property
    def ops(self) -> tuple[Op, ...]:
        return tuple(Op._make(o) for o in self.raw_ops)

    @property
    def makespan_s(self) -> float:
        return max(r.end_s for r in self.ranks)

    @property
    def critical(self) -> int:
        """The rank that ends last."""
        return max(range(len(self.ranks)), key=lambda r: self.ranks[r].end_s)


@lru_cache(maxsize=256)
def simulate(work: StepWork) -> StepTimeline:
    """The step's timeline (module docstring). Cached: a search documents placement twins with equal
    work."""
    if work.schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {work.schedule!r}")
    p, m = len(work.ranks), int(work.microbatches)
    if p < 1 or m < 1:
        raise ValueError(f"need at least one rank and one micro-batch, got {p}, {m}")
    chunks = work.chunks if work.schedule == "interleaved-1f1b" else 1
    sim = _Compute(work, chunks)
    if work.schedule == "zero-bubble" and p > 1:
        sim.run_greedy()
    else:
        sim.run_fixed([_order(work.schedule, r, p, m, chunks) for r in range(p)])
    spans = tuple(_rank_span(work, r, chunks, sim.ops[r], sim) for r in range(p))
    return StepTimeline(ranks=spans, raw_ops=tuple(o for rank_ops in sim.ops for o in rank_ops))


# --- schedule orders: (kind, micro-batch, chunk) per rank -----------------------------------------


def _order(schedule: str, rank: int, p: int, m: int, chunks: int) -> list[tuple[str, int, int]]:
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "interleaved-1f1b" and chunks > 1:
        forwards = [
            (i, c)
            for start in range(0, m, p)
            for c in range(chunks)
            for i in range(start, min(start + p, m))
        ]
        backwards = [(i, chunks - 1 - c) for i, c in forwards]
        warmup = min((p - rank - 1) * 2 + (chunks - 1) * p, len(forwards))
    else:
        forwards = backwards = [(i, 0) for i in range(m)]
        warmup = min(p - rank - 1, m)
    order = [("F", i, c) for i, c in forwards[:warmup]]
    for k in range(warmup, len(forwards)):
        order += [("F", *forwards[k]), ("B", *backwards[k - warmup])]
    return order + [("B", i, c) for i, c in backwards[len(forwards) - warmup :]]


# --- compute streams ------------------------------------------------------------------------------


class _Compute:
    """Places each operation at max(rank free, input arrived, parameters gathered)."""

    def __init__(self, work: StepWork, chunks: int):
        self.work, self.p, self.chunks, self.m = (
            work,
            len(work.ranks),
            chunks,
            int(work.microbatches),
        )
        self.split_w = work.schedule == "zero-bubble" and self.p > 1  # one stage: nothing to fill
        self.end: dict[tuple[str, int, int], float] = {}
        self.free = [0.0] * self.p
        self.ops: list[list[Op]] = [[] for _ in range(self.p)]
        self.durations = [{k: self.duration(r, k) for k in "FBW"} for r in range(self.p)]
        self.hops = [0.0] * self.p
        self.hidden_hops = [0.0] * self.p
        self.gate_wait = [0.0] * self.p
        self.last_stage = self.p * chunks - 1
        self.gates = [_gather_gates(work, r, chunks) for r in range(self.p)]

    def send_s(self, kind: str, stage: int) -> float:
        """The send after F (to the next stage) or B (to the previous), on another rank: one hop, or
        0."""
        if self.p == 1 or kind == "W":
            return 0.0
        sends = stage < self.last_stage if kind == "F" else stage > 0
        return self.work.hop_s if sends else 0.0

    def duration(self, rank: int, kind: str) -> float:
        w = self.work.ranks[rank]
        if kind == "F":
            return w.fwd_s / self.chunks
        weight = w.bwd_s * w.weight_grad_fraction / self.chunks if self.split_w else 0.0
        return weight if kind == "W" else w.bwd_s / self.chunks - weight

    def ready_s(self, kind: str, i: int, stage: int) -> float | None:
        """When (kind, micro-batch i, stage)'s input is there; None while not yet known."""
        hop = 0.0 if self.work.blocking_p2p else self.work.hop_s
        if kind == "F":
            if stage == 0:
                return 0.0
            prev = self.end.get(("F", i, stage - 1))
            return None if prev is None else prev + (hop if self.p > 1 else 0.0)
        if kind == "B":
            if stage == self.last_stage:
                return self.end.get(("F", i, stage))
            nxt = self.end.get(("B", i, stage + 1))
            return None if nxt is None else nxt + (hop if self.p > 1 else 0.0)
        return self.end.get(("B", i, stage))

    def start_s(self, rank: int, kind: str, i: int, chunk: int, ready: float) -> float:
        start = max(ready, self.free[rank])
        if kind == "F" and i == 0:
            gated = max(start, self.gates[rank][chunk])
            self.gate_wait[rank] += gated - start
            start = gated
        return start

    def commit(self, rank: int, kind: str, i: int, chunk: int, start: float) -> None:
        stage = chunk * self.p + rank
        send = self.send_s(kind, stage)
        hop = send if self.work.blocking_p2p else 0.0
        end = start + self.durations[rank][kind] + hop
        self.hops[rank] += hop
        self.hidden_hops[rank] += send - hop
        self.end[(kind, i, stage)] = end
        self.free[rank] = end
        self.ops[rank].append((rank, kind, i, chunk, start, end))

    def plan(self, rank: int, kind: str, i: int, chunk: int) -> tuple:
        """One operation of a fixed order, resolved once: (key, input key or None, input latency,
        duration with a blocking send, blocking send, overlapped send, parameter gate)."""
        stage = chunk * self.p + rank
        latency = self.work.hop_s if (not self.work.blocking_p2p and self.p > 1) else 0.0
        if kind == "F":
            dep = None if stage == 0 else ("F", i, stage - 1)
        elif stage == self.last_stage:
            dep, latency = ("F", i, stage), 0.0
        else:
            dep = ("B", i, stage + 1)
        send = self.send_s(kind, stage)
        hop = send if self.work.blocking_p2p else 0.0
        gate = self.gates[rank][chunk] if kind == "F" and i == 0 else 0.0
        return (
            (kind, i, stage),
            dep,
            latency,
            self.durations[rank][kind] + hop,
            hop,
            send - hop,
            gate,
        )

    def run_fixed(self, orders: list[list[tuple[str, int, int]]]) -> None:
        """Each rank's order in turn, as far as its inputs are known (ready_s, start_s and commit
        inlined: the loop runs once per operation)."""
        end, free, p = self.end, self.free, self.p
        plans = [[self.plan(r, *op) for op in order] for r, order in enumerate(orders)]
        pos = [0] * p
        remaining = sum(len(o) for o in orders)
        while remaining:
            moved = 0
            for r in range(p):
                plan, k, t_free, ops = plans[r], pos[r], free[r], self.ops[r]
                order = orders[r]
                while k < len(plan):
                    key, dep, latency, duration, hop, hidden, gate = plan[k]
                    if dep is None:
                        start = t_free
                    else:
                        arrived = end.get(dep)
                        if arrived is None:
                            break
                        start = arrived + latency
                        if t_free > start:
                            start = t_free
                    if gate > start:
                        self.gate_wait[r] += gate - start
                        start = gate
                    t_free = start + duration
                    end[key] = t_free
                    self.hops[r] += hop
                    self.hidden_hops[r] += hidden
                    kind, i, c = order[k]
                    ops.append((r, kind, i, c, start, t_free))
                    k += 1
                moved += k - pos[r]
                pos[r], free[r] = k, t_free
            if not moved:
                raise OrderDeadlock(
                    f"{self.work.schedule} order deadlocked: p={p}, m={self.m}, v={self.chunks}"
                )
            remaining -= moved

    def run_greedy(self) -> None:
        """ZB-H1 (Qi et al. 2023): B first, then F while fewer than p - r micro-batches are in
        flight, W in the slots left; the operation that can start first over all ranks goes next.
        A rank's choice depends on its own state and its neighbours' operations only, so after a
        commit on rank r the choices of r - 1, r and r + 1 are the ones recomputed."""
        nf, nb = [0] * self.p, [0] * self.p
        pending: list[list[int]] = [[] for _ in range(self.p)]
        choices = [self._choice(r, 0, 0, pending[r]) for r in range(self.p)]
        for _ in range(3 * self.m * self.p):
            live = [(c[0], r) for r, c in enumerate(choices) if c is not None]
            if not live:
                raise RuntimeError("zero-bubble schedule deadlocked")
            r = min(live)[1]
            start, kind, i = choices[r]
            self.commit(r, kind, i, 0, self.start_s(r, kind, i, 0, start))
            if kind == "F":
                nf[r] += 1
            elif kind == "B":
                nb[r] += 1
                pending[r].append(i)
            else:
                pending[r].remove(i)
            for q in (r - 1, r, r + 1):
                if 0 <= q < self.p:
                    choices[q] = self._choice(q, nf[q], nb[q], pending[q])

    def _choice(self, r: int, nf: int, nb: int, pending: list[int]):
        t = self.free[r]
        options = []
        if nb < nf:
            ready = self.ready_s("B", nb, r)
            if ready is not None:
                options.append((max(ready, t), 0, "B", nb))
        if nf < self.m and nf - nb < self.p - r:
            ready = self.ready_s("F", nf, r)
            if ready is not None:
                options.append((max(ready, t), 1, "F", nf))
        if pending:
            options.append((t, 2, "W", pending[0]))
        if not options:
            return None
        first = min(o[0] for o in options)
        start, _, kind, i = min((o for o in options if o[0] <= first), key=lambda o: o[1])
        return start, kind, i


def _gather_gates(work: StepWork, rank: int, chunks: int) -> list[float]:
    """When each chunk's first parameter bucket is gathered, with overlap_param_gather: the step
    starts with the rank's all-gathers, chunk by chunk in the forward's order (Megatron-Core
    dispatches the next bucket's gather as the forward reaches the current one); 0 without (the
    gather ran after the last optimizer step)."""
    w = work.ranks[rank]
    if not _gather_overlapped(work) or w.gather_s <= 0.0:
        return [0.0] * chunks
    per_chunk = w.gather_s / chunks
    return [c * per_chunk + per_chunk / max(1, w.buckets) for c in range(chunks)]


def _gather_overlapped(work: StepWork) -> bool:
    return work.overlap_param_gather and work.overlap_grad_reduce


# --- data-parallel stream -------------------------------------------------------------------------


def _drain(t0: float, s: float, e: float, n: int, d: float) -> float:
    """When a FIFO stream free at t0 finishes n pieces of d seconds released evenly over [s, e]
    (module docstring): max(t0 + n d, s + (e - s)/n + n d, e + d)."""
    n = max(1, int(n))
    return max(t0 + n * d, s + (e - s) / n + n * d, e + d)


def _rank_span(work: StepWork, rank: int, chunks: int, ops: list[Op], sim: _Compute) -> RankSpan:
    w = work.ranks[rank]
    compute_end = max(o[5] for o in ops)
    jobs, total = _dp_jobs(work, w, chunks, ops, compute_end)
    t = w.gather_s if _gather_overlapped(work) else 0.0
    for s, e, n, d in sorted(jobs, key=lambda j: (j[1], j[0])):
        t = _drain(t, s, e, n, d)
    after_gather = 0.0 if _gather_overlapped(work) else w.gather_s
    exposed = max(0.0, t - compute_end) + after_gather
    total += w.gather_s
    busy = sum(o[5] - o[4] for o in ops) - sim.hops[rank]
    span = compute_end
    if work.compute_speedup > 1.0:
        span = max(busy + sim.hops[rank] + sim.gate_wait[rank], compute_end / work.compute_speedup)
    hidden = max(0.0, total - exposed) + sim.hidden_hops[rank]
    return RankSpan(
        busy_s=busy,
        hops_s=sim.hops[rank],
        hidden_hops_s=sim.hidden_hops[rank],
        compute_end_s=span,
        gate_wait_s=sim.gate_wait[rank],
        dp_total_s=total,
        dp_exposed_s=exposed,
        end_s=span + exposed + work.interference * hidden,
    )


def _dp_jobs(work: StepWork, w: RankWork, chunks: int, ops: list[Op], compute_end: float):
    """Bucket streams (start, end, pieces, seconds per piece) of the rank's reductions, and their
    total seconds (the parameter gather of ZeRO 1-2 apart: _rank_span adds it)."""
    m = int(work.microbatches)
    grad_kind = "W" if any(o[1] == "W" for o in ops) else "B"
    jobs, total = [], 0.0
    if w.micro_gather_s > 0.0:  # ZeRO-3: each op's gather under the previous op
        ordered = [o for o in ops if o[1] != "W"]
        for prev, op in zip([None, *ordered], ordered):
            at = 0.0 if prev is None else prev[4]
            jobs.append((at, at, 1, w.micro_gather_s / chunks))
        total += 2.0 * m * w.micro_gather_s
    per_chunk: list[list[tuple]] = [[] for _ in range(chunks)]
    for o in ops:  # ops are in time order on their rank
        if o[1] == grad_kind:
            per_chunk[o[3]].append(o)
    for c_ops in per_chunk:
        for k, op in enumerate(c_ops):
            last = k == len(c_ops) - 1
            # ZeRO 0-2: the step's reduction after the chunk's last backward, ZeRO-2's reduce-
            # scatter after the
            # others; ZeRO-3 (reduce_s 0): a reduce-scatter after every backward
            d = w.reduce_s if (last and w.reduce_s > 0.0) else w.micro_reduce_s
            if d <= 0.0:
                continue
            d /= chunks
            total += d
            if work.overlap_grad_reduce:
                jobs.append((op[4], op[5], w.buckets, d / max(1, w.buckets)))
            else:
                jobs.append((compute_end, compute_end, 1, d))
    return jobs, total


# --- one candidate's work, from the per-op cost terms ---------------------------------------------

HEAD_FORWARD_SHARE = 1.0 / 3.0
"""Share of the LM head's time in the forward: one of its three GEMMs (forward, data and weight
gradients, compute.head_seconds)."""
EMBEDDING_FORWARD_SHARE = 0.5
"""Share of the embedding's time in the forward: one of its two all-reduces
(compute.embedding_seconds)."""
CP_FORWARD_SHARE = 1.0 / 3.0
"""Share of the context-parallel exchange in the forward: the ring passes K, V forward and K, V and
their gradients backward, twice the bytes (comm.cp_block_seconds)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockTerms:
    """One micro-batch's per-op terms (planner.score.block_terms) of one candidate, seconds."""

    block_fwd_s: float
    """A block's forward with its exposed tp, cp and ep time."""
    block_total_s: float
    """A block's forward, backward and recomputation with all their exposed communication."""
    recompute_unit_s: float
    """One fully recomputed block's recomputation (pipeline.stage_seconds' unit), 0 without."""
    full_share: float
    weight_grad_s: float
    """A block's weight-gradient GEMMs: half of its backward GEMMs (data and weight gradients have
    equal FLOPs)."""
    embedding_s: float
    head_s: float


def block_terms_of(x, block, tp, cp, ep, embedding_s, head_s, row: int = 0) -> BlockTerms:
    """BlockTerms of candidate `row` from planner.score.block_terms' records (the closed form's own
    terms: comm.tp_exposed_parts per pass, the cp and ep exchanges with the interference of their
    hidden part)."""
    i = eff(x.hw, "overlap_interference")
    tp_f, tp_b, tp_r = C.tp_exposed_parts(x, tp, block)
    cp_s = cp.exposed + i * (cp.total - cp.exposed)
    ep_s = ep.exposed + i * (ep.total - ep.exposed)
    ep_fwd = ep_s * ep.fwd / np.maximum(ep.total, 1e-30)
    share = x.full_share
    rec = block.recompute + tp.recompute + ep.recompute
    one = lambda a: _one(x, a, row)  # noqa: E731
    return BlockTerms(
        block_fwd_s=one(block.fwd + tp_f + CP_FORWARD_SHARE * cp_s + ep_fwd),
        block_total_s=one(block.total + tp_f + tp_b + tp_r + cp_s + ep_s),
        recompute_unit_s=one(np.where(share > 0, rec / np.maximum(share, 1e-30), 0.0)),
        full_share=one(share),
        weight_grad_s=one(0.5 * block.gemm_bwd),
        embedding_s=one(embedding_s),
        head_s=one(head_s),
    )


def _one(x, a, row: int) -> float:
    return float(np.broadcast_to(np.asarray(a, dtype=float), np.shape(x.dp)).reshape(-1)[row])


def rank_work(x, t: BlockTerms, rank: int, blocks: float, row: int = 0) -> RankWork:
    """One pipeline rank's RankWork: its blocks' forward and backward (pipeline.stage_seconds' per-
    rank sums, the embedding on the first rank and the head on the last), and its gradient reduction
    and parameter gather (comm.dp_reduction_parts of its own parameters, moe.rank_params) by ZeRO
    stage.
    """
    p = int(_one(x, x.pp, row))
    first, last = rank == 0, rank == p - 1
    recomputed = _one(x, x.recomputed_blocks(blocks, rank=rank), row)
    total = blocks * t.block_total_s + (recomputed - blocks * t.full_share) * t.recompute_unit_s
    fwd = blocks * t.block_fwd_s
    if first:
        fwd, total = fwd + EMBEDDING_FORWARD_SHARE * t.embedding_s, total + t.embedding_s
    if last:
        fwd, total = fwd + HEAD_FORWARD_SHARE * t.head_s, total + t.head_s
    bwd = max(total - fwd, 0.0)
    params = MO.rank_params(x, blocks, first, last)
    allreduce, rs, gather = (_one(x, a, row) for a in C.dp_reduction_parts(x, params))
    zero, m = int(_one(x, x.zero, row)), _one(x, x.m, row)
    grad_bytes = _one(x, params.total, row) * x.sw.state_bytes(x.precision).reduce
    chunks = (
        int(_one(x, x.v, row))
        if _one(x, x.schedule, row) == SCHEDULES.index("interleaved-1f1b")
        else 1
    )
    buckets = max(1, math.ceil(grad_bytes / chunks / C.DDP_BUCKET_BYTES))
    kw = dict(
        fwd_s=fwd,
        bwd_s=bwd,
        buckets=buckets,
        weight_grad_fraction=min(1.0, blocks * t.weight_grad_s / bwd) if bwd > 0 else 0.0,
    )
    if zero >= 3:
        return RankWork(**kw, micro_reduce_s=rs, micro_gather_s=gather)
    if zero == 0 or x.sw.bf16_optimizer:
        return RankWork(**kw, reduce_s=allreduce, gather_s=gather if x.sw.bf16_optimizer else 0.0)
    return RankWork(
        **kw, reduce_s=rs, gather_s=gather, micro_reduce_s=rs if zero == 2 and m > 1 else 0.0
    )


def step_work(x, t: BlockTerms, row: int = 0) -> StepWork:
    """The StepWork of candidate `row` of Step `x`: its schedule, every pipeline rank's work, the
    pipeline hop (comm.pp_hop_seconds) and the stack's overlaps (Software)."""
    schedule = SCHEDULES[int(_one(x, x.schedule, row))]
    v = int(_one(x, x.v, row))
    ranks = tuple(rank_work(x, t, k, b, row) for k, b in enumerate(x.rank_block_counts(row)))
    interleaved = schedule == "interleaved-1f1b" and v > 1
    return StepWork(
        schedule=schedule,
        microbatches=int(round(_one(x, x.m, row))),
        chunks=v,
        ranks=ranks,
        hop_s=_one(x, C.pp_hop_seconds(x), row) if len(ranks) > 1 else 0.0,
        blocking_p2p=not (interleaved and x.sw.overlap_p2p),
        overlap_grad_reduce=x.sw.overlap_grad_reduce,
        overlap_param_gather=x.sw.overlap_param_gather and not x.sw.bf16_optimizer,
        interference=eff(x.hw, "overlap_interference"),
        compute_speedup=eff(x.hw, "shared_cores_speedup"),
    )


def after_reduction_seconds(x, row: int = 0) -> float:
    """Per-step communication after every rank's reduction that the closed form costs: the tied
    embedding's first/last-stage gradient all-reduce (comm.tied_embedding_sync_seconds), not
    overlapped."""
    if not x.spec.tied_embeddings or _one(x, x.pp, row) <= 1:
        return 0.0
    tied_bytes = 4.0 if x.sw.bf16_optimizer else x.sw.state_bytes(x.precision).reduce
    return _one(
        x,
        C.tied_embedding_sync_seconds(
            x.spec.vocab, x.spec.hidden, x.tp, tied_bytes, x.local["P"] >= x.pp, x.hw
        ),
        row,
    )
