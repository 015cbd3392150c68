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
  buckets of comm.gradient_buckets: the stack's size, PyTorch DDP's 25 MiB by default, Li et al.
  2020), so in the interleaved schedule the later chunks' reductions run under the earlier
  chunks' cool-down; ZeRO-2 reduce-scatters every micro-batch's
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

Engine: numpy and plain Python, no library. The operations of a rank are a fixed list (the
schedule's order), and an operation's start depends only on already-finished operations, so a
round-robin over ranks that places each rank's next operations while their inputs are known is an
exact event loop, O(operations). The orders, durations, sends and each operation's input are laid
out as arrays once (_FixedOrders), so the loop itself reads flat lists by index: a 16-stage 1F1B
step of 192 micro-batches (6,144 operations) in 9.5 ms of CPU, against 29 ms for the keyed loop it
replaced (same machine, loaded). A general discrete-event library (SimPy and the like) would add a
dependency and a per-event coroutine cost for nothing the fixed orders need; ZB-H1's greedy choice
is the one place the next event must be picked by time (_Compute). Iterating the per-rank max-plus
scans to a fixed point was tried and is exact, but needs O(m) sweeps where the critical path zig-
zags between ranks (1F1B with uneven stages)."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from cost_models import comm as C
from cost_models import host as H
from cost_models import moe as MO
from cost_models.compute import eff
from cost_models.pipeline import warmup_forwards
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
    fwd_host_s: float = 0.0
    """Host time to issue fwd_s's kernels (cost_models.host.block_host_seconds)."""
    bwd_host_s: float = 0.0
    """Host time to issue bwd_s's kernels."""


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
    host_synced: bool = False
    """The host waits for the device before every operation (a blocking pipeline,
    cost_models.host.host_synced): each operation takes max(device, host); otherwise the host runs
    ahead from the step's start and an operation ends no earlier than the host has issued it."""


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
    host_wait_s: float = 0.0
    """Time its operations waited for the host to issue them (StepWork.host_synced)."""
    dp_total_s: float
    dp_exposed_s: float
    """Data-parallel time after the compute ended (and the gather after the optimizer without
    overlap)."""
    end_s: float
    """compute_end + dp_exposed + interference x hidden."""

    @property
    def bubble_s(self) -> float:
        idle = self.compute_end_s - self.busy_s - self.hops_s - self.gate_wait_s - self.host_wait_s
        return max(0.0, idle)


KINDS = "FBW"
"""Operation kinds by their code in an OpTable."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTable:
    """Every rank's operations in its stream's order, one row per rank (every rank of a schedule
    runs as many operations), and what each rank's sends and parameter gates cost it."""

    kind: np.ndarray
    """Codes into KINDS."""
    microbatch: np.ndarray
    chunk: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    hops_s: np.ndarray
    """Per rank: blocking pipeline sends on its compute stream."""
    hidden_hops_s: np.ndarray
    """Per rank: overlapped pipeline sends."""
    gate_wait_s: np.ndarray
    """Per rank: time its first forwards waited for their parameters."""
    host_wait_s: np.ndarray
    """Per rank: time its operations waited for the host to issue them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeline:
    ranks: tuple[RankSpan, ...]
    table: OpTable

    @property
    def ops(self) -> tuple[Op, ...]:
        """Every operation, rank by rank in its stream's order."""
        t = self.table
        rows = zip(
            *(a.ravel().tolist() for a in (t.kind, t.microbatch, t.chunk, t.start_s, t.end_s))
        )
        n = t.kind.shape[1]
        return tuple(
            Op(k // n, KINDS[kind], i, c, s, e) for k, (kind, i, c, s, e) in enumerate(rows)
        )

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
    if work.schedule == "zero-bubble" and p > 1:
        sim = _Compute(work, chunks)
        sim.run_greedy()
        table = sim.table()
    else:
        table = _FixedOrders(work, chunks).run()
    return StepTimeline(
        ranks=tuple(_rank_span(work, r, chunks, table) for r in range(p)), table=table
    )


# --- compute streams ------------------------------------------------------------------------------


class _Compute:
    """ZB-H1's greedy order (run_greedy), each operation placed at max(rank free, input arrived,
    parameters gathered). One model chunk per rank (stage = rank); per rank and kind, end times in
    lists indexed by micro-batch: the loop makes tens of thousands of operations."""

    def __init__(self, work: StepWork, chunks: int):
        p, m = len(work.ranks), int(work.microbatches)
        self.work, self.p, self.chunks, self.m = work, p, chunks, m
        self.split_w = work.schedule == "zero-bubble" and p > 1  # one stage: nothing to fill
        self.end_f: list[list[float | None]] = [[None] * m for _ in range(p)]
        self.end_b: list[list[float | None]] = [[None] * m for _ in range(p)]
        self.free = [0.0] * p
        self.ops: list[list[tuple[int, int, int, float, float]]] = [[] for _ in range(p)]
        self.durations = [{k: self.duration(r, k) for k in KINDS} for r in range(p)]
        self.host = [{k: self.host_s(r, k) for k in KINDS} for r in range(p)]
        self.host_end = [0.0] * p
        self.host_wait = [0.0] * p
        self.hops = [0.0] * p
        self.hidden_hops = [0.0] * p
        self.gate_wait = [0.0] * p
        self.gates = [_gather_gates(work, r, chunks) for r in range(p)]
        self.hop = 0.0 if work.blocking_p2p else work.hop_s
        """Arrival delay of a non-blocking send (a blocking one ends its sender's operation)."""

    def send_s(self, kind: str, rank: int) -> float:
        """The send after F (to the next stage) or B (to the previous), on another rank: one hop, or
        0."""
        if self.p == 1 or kind == "W":
            return 0.0
        sends = rank < self.p - 1 if kind == "F" else rank > 0
        return self.work.hop_s if sends else 0.0

    def duration(self, rank: int, kind: str) -> float:
        w = self.work.ranks[rank]
        if kind == "F":
            return w.fwd_s / self.chunks
        weight = w.bwd_s * w.weight_grad_fraction / self.chunks if self.split_w else 0.0
        return weight if kind == "W" else w.bwd_s / self.chunks - weight

    def host_s(self, rank: int, kind: str) -> float:
        """Host time to issue operation `kind` (split as duration splits the device time)."""
        w = self.work.ranks[rank]
        if kind == "F":
            return w.fwd_host_s / self.chunks
        weight = w.bwd_host_s * w.weight_grad_fraction / self.chunks if self.split_w else 0.0
        return weight if kind == "W" else w.bwd_host_s / self.chunks - weight

    def commit(self, rank: int, kind: str, i: int, start: float) -> None:
        if kind == "F" and i == 0:  # the first forward waits for its parameters
            gated = max(start, self.gates[rank][0])
            self.gate_wait[rank] += gated - start
            start = gated
        send = self.send_s(kind, rank)
        hop = send if self.work.blocking_p2p else 0.0
        device, host = self.durations[rank][kind], self.host[rank][kind]
        if self.work.host_synced:  # the host issues the operation from its start
            issued = start + host
        else:  # the host ran ahead from the step's start
            issued = self.host_end[rank] = self.host_end[rank] + host
        self.host_wait[rank] += max(0.0, issued - start - device)
        end = max(start + device, issued) + hop
        self.hops[rank] += hop
        self.hidden_hops[rank] += send - hop
        if kind == "F":
            self.end_f[rank][i] = end
        elif kind == "B":
            self.end_b[rank][i] = end
        self.free[rank] = end
        self.ops[rank].append((KINDS.index(kind), i, 0, start, end))

    def table(self) -> OpTable:
        ops = np.array(self.ops, dtype=float).reshape(self.p, -1, 5)
        return OpTable(
            kind=ops[:, :, 0].astype(int),
            microbatch=ops[:, :, 1].astype(int),
            chunk=ops[:, :, 2].astype(int),
            start_s=ops[:, :, 3],
            end_s=ops[:, :, 4],
            hops_s=np.asarray(self.hops),
            hidden_hops_s=np.asarray(self.hidden_hops),
            gate_wait_s=np.asarray(self.gate_wait),
            host_wait_s=np.asarray(self.host_wait),
        )

    def run_greedy(self) -> None:
        """ZB-H1 (Qi et al. 2023): B first, then F while fewer than p - r micro-batches are in
        flight, W in the slots left; the operation that can start first over all ranks goes next
        (ties: the lower rank). A rank's choice depends on its own state and its neighbours'
        operations only, so after a commit on rank r the choices of r - 1, r and r + 1 are the ones
        recomputed."""
        p = self.p
        nf, nb = [0] * p, [0] * p
        pending: list[deque[int]] = [deque() for _ in range(p)]
        choices = [self._choice(r, 0, 0, pending[r]) for r in range(p)]
        version = [0] * p
        heap = [(c[0], r, 0) for r, c in enumerate(choices) if c is not None]
        heapq.heapify(heap)  # (start, rank, version): the earliest start, then the lower rank
        for _ in range(3 * self.m * p):
            while heap and heap[0][2] != version[heap[0][1]]:
                heapq.heappop(heap)  # a choice recomputed since it was pushed
            if not heap:
                raise RuntimeError("zero-bubble schedule deadlocked")
            r = heap[0][1]
            start, _, kind, i = choices[r]
            self.commit(r, kind, i, start)
            if kind == "F":
                nf[r] += 1
            elif kind == "B":
                nb[r] += 1
                pending[r].append(i)
            else:
                pending[r].popleft()
            for q in (r - 1, r, r + 1):
                if 0 <= q < p:
                    choices[q] = c = self._choice(q, nf[q], nb[q], pending[q])
                    version[q] += 1
                    if c is not None:
                        heapq.heappush(heap, (c[0], q, version[q]))

    def _choice(self, r: int, nf: int, nb: int, pending: deque[int]):
        """(start, priority, kind, micro-batch) of rank r's next operation: the earliest start, then
        B before F before W; None while no input is there."""
        t = self.free[r]
        options = []
        if nb < nf:
            ready = self.end_f[r][nb] if r == self.p - 1 else self.end_b[r + 1][nb]
            if ready is not None:
                ready = ready if r == self.p - 1 else ready + self.hop
                options.append((ready if ready > t else t, 0, "B", nb))
        if nf < self.m and nf - nb < self.p - r:
            ready = 0.0 if r == 0 else self.end_f[r - 1][nf]
            if ready is not None:
                ready = ready if r == 0 else ready + self.hop
                options.append((ready if ready > t else t, 1, "F", nf))
        if pending:
            options.append((t, 2, "W", pending[0]))
        return min(options) if options else None


class _FixedOrders:
    """The fixed orders (GPipe, 1F1B, interleaved 1F1B) laid out as arrays: every rank runs the same
    forward sequence (_forward_sequence), its warm-up forwards (p - r - 1; interleaved (p - r - 1) 2
    + (v - 1) p; GPipe all), then one forward and one backward in turn, then the cool-down
    backwards; each operation's input (the previous stage's F, the next stage's B) is a flat index,
    so the event loop reads lists, not keys."""

    def __init__(self, work: StepWork, chunks: int):
        p, m, v = len(work.ranks), int(work.microbatches), chunks
        self.work, self.p, self.v = work, p, v
        n = m * v
        seq_i, seq_c = _forward_sequence(p, m, v)
        ranks = np.arange(p)[:, None]
        warm = warmup_forwards(p, ranks, m, v, gpipe=work.schedule == "gpipe")
        k = np.arange(n)[None, :]
        f_pos = np.where(k < warm, k, warm + 2 * (k - warm))  # (p, n): where forward k runs
        b_pos = np.where(k < n - warm, warm + 2 * k + 1, n + k)
        seq_of = np.empty((m, v), dtype=int)  # forward sequence index of (micro-batch, chunk)
        seq_of[seq_i, seq_c] = np.arange(n)
        self.f_pos, self.b_pos, self.seq_of = f_pos, b_pos, seq_of
        self._layout(seq_i, seq_c, m)

    def _flat(self, rank, pos):
        return rank * (2 * self.m_v) + pos

    def _layout(self, seq_i, seq_c, m):
        p, v, w = self.p, self.v, self.work
        n = self.m_v = m * v
        ranks = np.arange(p)[:, None]
        kind = np.zeros((p, 2 * n), dtype=int)
        mb, chunk = np.zeros_like(kind), np.zeros_like(kind)
        rows = np.broadcast_to(ranks, (p, n))
        kind[rows, self.b_pos] = 1
        mb[rows, self.f_pos], chunk[rows, self.f_pos] = seq_i, seq_c
        mb[rows, self.b_pos], chunk[rows, self.b_pos] = seq_i, v - 1 - seq_c
        stage = chunk * p + ranks
        last = p * v - 1
        fwd, bwd, fwd_host, bwd_host = (
            np.array([[getattr(r, a) / v] for r in w.ranks])
            for a in ("fwd_s", "bwd_s", "fwd_host_s", "bwd_host_s")
        )
        sends = (p > 1) & np.where(kind == 0, stage < last, stage > 0)
        send = np.where(sends, w.hop_s, 0.0)
        hop = send if w.blocking_p2p else np.zeros_like(send)
        device = np.where(kind == 0, fwd, bwd)
        host = np.where(kind == 0, fwd_host, bwd_host)
        # synced: each operation takes max(device, host); else the host's running total (the step
        # starts after the last step's synchronization) is when each operation is issued
        self.host_extra = np.maximum(0.0, host - device) if w.host_synced else np.zeros_like(host)
        self.issued = np.zeros_like(host) if w.host_synced else np.cumsum(host, axis=1)
        self.duration = device + self.host_extra + hop
        self.hop, self.hidden = hop, send - hop
        latency = w.hop_s if (not w.blocking_p2p and p > 1) else 0.0
        # the input: F of the stage before, B of the stage after, the last stage's own F
        prev_stage, next_stage = stage - 1, stage + 1
        f_dep = self._flat(
            prev_stage % p,
            self.f_pos[prev_stage % p, self.seq_of[mb, np.maximum(prev_stage // p, 0)]],
        )
        own_f = self._flat(ranks, self.f_pos[ranks, self.seq_of[mb, chunk]])
        nxt_r, nxt_c = next_stage % p, np.minimum(next_stage // p, v - 1)
        b_dep = self._flat(nxt_r, self.b_pos[nxt_r, self.seq_of[mb, v - 1 - nxt_c]])
        is_f = kind == 0
        self.dep = np.where(is_f, f_dep, np.where(stage == last, own_f, b_dep))
        self.has_dep = np.where(is_f, stage > 0, True)
        self.latency = np.where(is_f | (stage < last), latency, 0.0)
        gates = np.array([_gather_gates(w, r, v) for r in range(p)])
        self.gate = np.where(is_f & (mb == 0), gates[ranks, chunk], 0.0)
        self.kind, self.mb, self.chunk = kind, mb, chunk

    def run(self) -> OpTable:
        """Each rank's operations in its order, as far as their inputs are known, rank after rank
        until all are placed (an exact event loop: an operation starts at max(its rank free, its
        input arrived + latency, its parameter gate)); a round that places nothing is a deadlock."""
        p, n = self.p, 2 * self.m_v
        duration, latency, gate, issued = (
            a.ravel().tolist() for a in (self.duration, self.latency, self.gate, self.issued)
        )
        dep = np.where(self.has_dep, self.dep, -1).ravel().tolist()
        end, late = [-1.0] * (p * n), [0.0] * (p * n)
        wait, free, pos = [0.0] * p, [0.0] * p, [0] * p
        remaining = p * n
        while remaining:
            moved = 0
            for r in range(p):
                k, t, base = pos[r], free[r], r * n
                while k < n:
                    j = base + k
                    d = dep[j]
                    if d >= 0:
                        arrived = end[d]
                        if arrived < 0.0:
                            break
                        arrived += latency[j]
                        if arrived > t:
                            t = arrived
                    if gate[j] > t:
                        wait[r] += gate[j] - t
                        t = gate[j]
                    t += duration[j]
                    if issued[j] > t:  # the host has not issued it yet
                        late[j] = issued[j] - t
                        t = issued[j]
                    end[j] = t
                    k += 1
                moved += k - pos[r]
                pos[r], free[r] = k, t
            if not moved:
                raise OrderDeadlock(
                    f"{self.work.schedule} order deadlocked: p={p}, m={self.work.microbatches}, "
                    f"v={self.v}"
                )
            remaining -= moved
        end_s, late_s = np.asarray(end).reshape(p, n), np.asarray(late).reshape(p, n)
        return OpTable(
            kind=self.kind,
            microbatch=self.mb,
            chunk=self.chunk,
            start_s=end_s - self.duration - late_s,
            end_s=end_s,
            hops_s=self.hop.sum(axis=1),
            hidden_hops_s=self.hidden.sum(axis=1),
            gate_wait_s=np.asarray(wait),
            host_wait_s=(self.host_extra + late_s).sum(axis=1),
        )


def _forward_sequence(p: int, m: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """The forwards every rank runs, in order, as (micro-batches, chunks): micro-batch by
    micro-batch with one chunk; interleaved, rounds of p micro-batches (the last may be partial),
    chunk by chunk within a round (Megatron-Core's
    forward_backward_pipelining_with_interleaving)."""
    if v == 1:
        return np.arange(m), np.zeros(m, dtype=int)
    pairs = [
        (i, c)
        for start in range(0, m, p)
        for c in range(v)
        for i in range(start, min(start + p, m))
    ]
    seq = np.array(pairs, dtype=int)
    return seq[:, 0], seq[:, 1]


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


def _drain(t0: float, jobs: np.ndarray) -> float:
    """When a FIFO stream free at t0 finishes its bucket streams, each (start s, end e, pieces n,
    seconds d) releasing n pieces of d seconds evenly over [s, e], taken in order of (e, s): one
    stream drains at max(t + n d, s + (e - s)/n + n d, e + d) from t (module docstring), so the
    last ends at max(t0 + sum(n d), max_j(b_j + the n d of the streams after j)), b_j the last two
    terms of stream j."""
    if not len(jobs):
        return t0
    s, e, n, d = jobs[np.lexsort((jobs[:, 0], jobs[:, 1]))].T
    n = np.maximum(1, n.astype(int))
    work = n * d
    released = np.maximum(s + (e - s) / n + work, e + d)
    after = work.sum() - np.cumsum(work)
    return float(max(t0 + work.sum(), np.max(released + after)))


def _rank_span(work: StepWork, rank: int, chunks: int, table: OpTable) -> RankSpan:
    w = work.ranks[rank]
    start, end = table.start_s[rank], table.end_s[rank]
    compute_end = float(end.max())
    jobs, total = _dp_jobs(work, w, chunks, table, rank, compute_end)
    t = _drain(w.gather_s if _gather_overlapped(work) else 0.0, jobs)
    after_gather = 0.0 if _gather_overlapped(work) else w.gather_s
    exposed = max(0.0, t - compute_end) + after_gather
    total += w.gather_s
    hops, hidden_hops = float(table.hops_s[rank]), float(table.hidden_hops_s[rank])
    gate_wait, host_wait = float(table.gate_wait_s[rank]), float(table.host_wait_s[rank])
    busy = float((end - start).sum()) - hops - host_wait
    span = compute_end
    if work.compute_speedup > 1.0:
        span = max(busy + hops + gate_wait + host_wait, compute_end / work.compute_speedup)
    hidden = max(0.0, total - exposed) + hidden_hops
    return RankSpan(
        busy_s=busy,
        hops_s=hops,
        hidden_hops_s=hidden_hops,
        compute_end_s=span,
        gate_wait_s=gate_wait,
        host_wait_s=host_wait,
        dp_total_s=total,
        dp_exposed_s=exposed,
        end_s=span + exposed + work.interference * hidden,
    )


def _dp_jobs(
    work: StepWork, w: RankWork, chunks: int, table: OpTable, rank: int, compute_end: float
) -> tuple[np.ndarray, float]:
    """Bucket streams (start, end, pieces, seconds per piece) of the rank's reductions, one row
    each, and their total seconds (the parameter gather of ZeRO 1-2 apart: _rank_span adds it)."""
    m = int(work.microbatches)
    kind, chunk = table.kind[rank], table.chunk[rank]
    start, end = table.start_s[rank], table.end_s[rank]
    grad_kind = KINDS.index("W") if (kind == KINDS.index("W")).any() else KINDS.index("B")
    jobs, total = [], 0.0
    if w.micro_gather_s > 0.0:  # ZeRO-3: each op's gather under the previous op
        at = np.concatenate([[0.0], start[kind != KINDS.index("W")][:-1]])
        jobs.append(_jobs(at, at, 1, w.micro_gather_s / chunks))
        total += 2.0 * m * w.micro_gather_s
    for c in range(chunks):  # ops are in time order on their rank
        grads = np.flatnonzero((kind == grad_kind) & (chunk == c))
        # ZeRO 0-2: the step's reduction after the chunk's last backward, ZeRO-2's reduce-scatter
        # after the others; ZeRO-3 (reduce_s 0): a reduce-scatter after every backward
        d = np.full(len(grads), w.micro_reduce_s)
        if len(grads) and w.reduce_s > 0.0:
            d[-1] = w.reduce_s
        keep = d > 0.0
        grads, d = grads[keep], d[keep] / chunks
        total += float(d.sum())
        if work.overlap_grad_reduce:
            buckets = max(1, w.buckets)
            jobs.append(_jobs(start[grads], end[grads], w.buckets, d / buckets))
        else:
            jobs.append(_jobs(compute_end, compute_end, 1, d))
    return (np.concatenate(jobs) if jobs else np.zeros((0, 4))), total


def _jobs(s, e, n, d) -> np.ndarray:
    """Bucket streams as rows (s, e, n, d), the arguments broadcast."""
    return np.stack(np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (s, e, n, d))), 1)


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
    block_fwd_host_s: float = 0.0
    """Host time to issue a block's forward (cost_models.host.block_host_parts)."""
    block_bwd_host_s: float = 0.0
    """Host time to issue a block's backward, recomputation apart."""
    recompute_host_unit_s: float = 0.0
    """Host time to issue one recomputed block's forward again."""
    head_host_s: float = 0.0
    """Host time to issue the head's forward and backward."""


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
    h_f, h_b, h_r = H.block_host_parts(x)
    return BlockTerms(
        block_fwd_host_s=one(h_f),
        block_bwd_host_s=one(h_b),
        recompute_host_unit_s=one(h_r),
        head_host_s=one(H.head_host_seconds(x)),
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


def _rank_key(x, rank: int, blocks: float, row: int) -> tuple[float, bool, bool, float]:
    """What sets a rank's work: its blocks, whether it is first or last, its recomputed blocks (a
    pipeline's middle ranks share one key, so step_work costs each key once)."""
    p = int(_one(x, x.pp, row))
    recomputed = _one(x, x.recomputed_blocks(blocks, rank=rank), row)
    return blocks, rank == 0, rank == p - 1, recomputed


def rank_work(x, t: BlockTerms, key: tuple[float, bool, bool, float], row: int = 0) -> RankWork:
    """The RankWork of a pipeline rank known by its _rank_key: its blocks' forward and backward
    (pipeline.stage_seconds' per-rank sums, the embedding on the first rank and the head on the
    last), and its gradient reduction and parameter gather (comm.dp_reduction_parts of its own
    parameters, moe.rank_params) by ZeRO stage."""
    blocks, first, last, recomputed = key
    total = blocks * t.block_total_s + (recomputed - blocks * t.full_share) * t.recompute_unit_s
    fwd = blocks * t.block_fwd_s
    fwd_host = blocks * t.block_fwd_host_s
    bwd_host = blocks * t.block_bwd_host_s + recomputed * t.recompute_host_unit_s
    if first:
        fwd, total = fwd + EMBEDDING_FORWARD_SHARE * t.embedding_s, total + t.embedding_s
    if last:
        fwd, total = fwd + HEAD_FORWARD_SHARE * t.head_s, total + t.head_s
        fwd_host += HEAD_FORWARD_SHARE * t.head_host_s
        bwd_host += (1.0 - HEAD_FORWARD_SHARE) * t.head_host_s
    bwd = max(total - fwd, 0.0)
    params = MO.rank_params(x, blocks, first, last)
    allreduce, rs, gather = (_one(x, a, row) for a in C.dp_reduction_parts(x, params))
    zero, m = int(_one(x, x.zero, row)), _one(x, x.m, row)
    buckets = int(_one(x, C.gradient_buckets(x, params.total), row))
    kw = dict(
        fwd_s=fwd,
        bwd_s=bwd,
        fwd_host_s=fwd_host,
        bwd_host_s=bwd_host,
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
    keys = [_rank_key(x, k, b, row) for k, b in enumerate(x.rank_block_counts(row))]
    works = {key: rank_work(x, t, key, row) for key in dict.fromkeys(keys)}
    ranks = tuple(works[key] for key in keys)
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
        host_synced=bool(_one(x, H.host_synced(x), row)),
    )


def after_reduction_seconds(x, row: int = 0) -> float:
    """Per-step communication on the critical path that the closed form costs and the simulated
    streams do not hold: the per-block collectives' ring latency of FSDP-style sharding
    (comm.shard_unit_latency_seconds), delayed FP8 scaling's amax all-reduces
    (comm.fp8_amax_reduction_seconds) and the tied embedding's first/last-stage gradient all-reduce
    (comm.tied_embedding_sync_seconds), none overlapped."""
    unit_s = _one(x, C.shard_unit_latency_seconds(x), row)
    amax_s = _one(x, C.fp8_amax_reduction_seconds(x), row)
    return unit_s + amax_s + _tied_sync_seconds(x, row)


def _tied_sync_seconds(x, row: int) -> float:
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
