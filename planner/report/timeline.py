"""Pipeline timelines: when each stage runs which micro-batch's forward and backward.

The op *order* of each schedule is taken from its paper; the op *durations* are the estimate's
per-micro-batch forward/backward times of each stage (nothing is costed here). A list scheduler
then places every op at the earliest time its rank is free and its inputs have arrived, so the
idle gaps in the chart are the pipeline bubble that order implies.

- GPipe (Huang et al. 2019, "GPipe", Fig. 2): all forwards, then all backwards.
- 1F1B / PipeDream-Flush (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", Sec. 2.2.1, Fig. 3): rank r runs min(P-r-1, m) warm-up
  forwards, then alternates one forward and one backward, then drains the backwards.
- Interleaved 1F1B (same paper, Fig. 4): v model chunks per rank, stage id c*P + r; forwards go
  through chunks in rounds of P micro-batches; warm-up (P-r-1)*2 + (v-1)*P.
- Zero bubble (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", ZB-H1): the backward is split
  into the input gradient B (on the critical path) and the weight gradient W (not), at most
  P-r micro-batches in flight on rank r as in 1F1B; W fills otherwise idle slots (greedy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

OpKind = Literal["F", "B", "W"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTimes:
    """Per-micro-batch durations of one pipeline rank (all its chunks together), seconds."""

    forward_s: float
    """Forward of one micro-batch through this rank's layers."""
    backward_s: float
    """Whole backward (input and weight gradients) of one micro-batch through this rank's layers."""
    weight_grad_fraction: float = 0.5
    """Share of `backward_s` that is the weight gradient W (zero-bubble only); Qi et al. take B ~ W."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One scheduled piece of work on one pipeline rank."""

    rank: int
    kind: OpKind
    microbatch: int
    chunk: int
    """Model chunk on this rank (0 unless interleaved / V-shaped)."""
    start_s: float
    end_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeline:
    schedule: str
    ranks: int
    microbatches: int
    chunks: int
    ops: tuple[Op, ...]

    @property
    def makespan_s(self) -> float:
        return max(op.end_s for op in self.ops) if self.ops else 0.0

    def busy_s(self, rank: int) -> float:
        return sum(op.end_s - op.start_s for op in self.ops if op.rank == rank)

    def idle_fraction(self) -> float:
        """Idle share of ranks x makespan (the bubble fraction this order implies)."""
        total = self.ranks * self.makespan_s
        return 1.0 - sum(self.busy_s(r) for r in range(self.ranks)) / total if total else 0.0


def build_timeline(
    schedule: str,
    stage_times: Sequence[StageTimes],
    microbatches: int,
    *,
    virtual_stages: int = 1,
    p2p_s: float = 0.0,
) -> Timeline:
    """Simulate `schedule` on len(stage_times) ranks with `microbatches` micro-batches.

    `p2p_s` is the send/receive time of one activation (or gradient) between adjacent stages.
    """
    ranks = len(stage_times)
    if ranks < 1 or microbatches < 1:
        raise ValueError(f"need at least one rank and one micro-batch, got {ranks}, {microbatches}")
    chunks = virtual_stages if schedule == "interleaved-1f1b" else 1
    sim = _Simulator(
        ranks, chunks, microbatches, stage_times, p2p_s, split_w=schedule == "zero-bubble"
    )
    if schedule == "zero-bubble":
        sim.run_greedy()
    else:
        orders = {
            "gpipe": _gpipe_order,
            "1f1b": _one_f_one_b_order,
            "interleaved-1f1b": _interleaved_order,
        }
        if schedule not in orders:
            raise ValueError(f"unknown schedule {schedule!r}")
        sim.run_fixed([orders[schedule](r, ranks, microbatches, chunks) for r in range(ranks)])
    return Timeline(
        schedule=schedule,
        ranks=ranks,
        microbatches=microbatches,
        chunks=chunks,
        ops=tuple(sorted(sim.done_ops, key=lambda o: (o.rank, o.start_s))),
    )


# --- op orders (kind, microbatch, chunk) per rank ------------------------------------------------


def _gpipe_order(rank, ranks, m, chunks):
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def _one_f_one_b_order(rank, ranks, m, chunks):
    warmup = min(ranks - rank - 1, m)
    order = [("F", i, 0) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        order += [("F", f, 0), ("B", b, 0)]
        f += 1
        b += 1
    order += [("B", i, 0) for i in range(b, m)]
    return order


def _interleaved_order(rank, ranks, m, chunks):
    forwards = [
        (c, i)
        for start in range(0, m, ranks)
        for c in range(chunks)
        for i in range(start, min(start + ranks, m))
    ]
    backwards = [(chunks - 1 - c, i) for c, i in forwards]
    total = len(forwards)
    warmup = min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, total)
    order = [("F", i, c) for c, i in forwards[:warmup]]
    f, b = warmup, 0
    while f < total:
        order += [("F", forwards[f][1], forwards[f][0]), ("B", backwards[b][1], backwards[b][0])]
        f += 1
        b += 1
    order += [("B", i, c) for c, i in backwards[b:]]
    return order


# --- list scheduler ------------------------------------------------------------------------------


class _Simulator:
    """Places ops at max(rank free, inputs arrived); dependencies follow the stage chain."""

    def __init__(self, ranks, chunks, m, stage_times, p2p_s, *, split_w):
        self.ranks, self.chunks, self.m = ranks, chunks, m
        self.times, self.p2p_s, self.split_w = stage_times, p2p_s, split_w
        self.end: dict[tuple[str, int, int], float] = {}  # (kind, microbatch, stage id) -> end time
        self.free = [0.0] * ranks
        self.done_ops: list[Op] = []
        self.last_stage = ranks * chunks - 1

    def duration(self, rank: int, kind: str) -> float:
        t = self.times[rank]
        if kind == "F":
            return t.forward_s / self.chunks
        if not self.split_w:
            return t.backward_s / self.chunks
        w = t.backward_s * t.weight_grad_fraction / self.chunks
        return w if kind == "W" else t.backward_s / self.chunks - w

    def ready_s(self, kind: str, i: int, stage: int) -> float | None:
        """When the inputs of (kind, micro-batch i, stage id) are available; None if not yet known."""
        if kind == "F":
            if stage == 0:
                return 0.0
            prev = self.end.get(("F", i, stage - 1))
            return None if prev is None else prev + self._hop(stage - 1, stage)
        if kind == "B":
            if stage == self.last_stage:
                return self.end.get(("F", i, stage))
            nxt = self.end.get(("B", i, stage + 1))
            return None if nxt is None else nxt + self._hop(stage + 1, stage)
        return self.end.get(("B", i, stage))  # W after its own B

    def _hop(self, a: int, b: int) -> float:
        return 0.0 if a % self.ranks == b % self.ranks else self.p2p_s

    def commit(self, rank, kind, i, chunk, start) -> None:
        stage = chunk * self.ranks + rank
        end = start + self.duration(rank, kind)
        self.end[(kind, i, stage)] = end
        self.free[rank] = end
        self.done_ops.append(
            Op(rank=rank, kind=kind, microbatch=i, chunk=chunk, start_s=start, end_s=end)
        )

    def run_fixed(self, orders: list[list[tuple[str, int, int]]]) -> None:
        pos = [0] * self.ranks
        remaining = sum(len(o) for o in orders)
        while remaining:
            best = None
            for r in range(self.ranks):
                if pos[r] == len(orders[r]):
                    continue
                kind, i, c = orders[r][pos[r]]
                ready = self.ready_s(kind, i, c * self.ranks + r)
                if ready is not None:
                    start = max(ready, self.free[r])
                    if best is None or start < best[0]:
                        best = (start, r, kind, i, c)
            assert best is not None, "schedule order deadlocked"
            start, r, kind, i, c = best
            self.commit(r, kind, i, c, start)
            pos[r] += 1
            remaining -= 1

    def run_greedy(self) -> None:
        """ZB-H1: B first, then F while fewer than P-r micro-batches are in flight, W in idle slots."""
        next_f = [0] * self.ranks
        next_b = [0] * self.ranks
        pending_w: list[list[int]] = [[] for _ in range(self.ranks)]
        remaining = 3 * self.m * self.ranks
        while remaining:
            best = None
            for r in range(self.ranks):
                choice = self._greedy_choice(r, next_f[r], next_b[r], pending_w[r])
                if choice is not None and (best is None or choice[0] < best[0]):
                    best = (*choice, r)
            assert best is not None, "zero-bubble greedy schedule deadlocked"
            start, kind, i, r = best
            self.commit(r, kind, i, 0, start)
            if kind == "F":
                next_f[r] += 1
            elif kind == "B":
                next_b[r] += 1
                pending_w[r].append(i)
            else:
                pending_w[r].remove(i)
            remaining -= 1

    def _greedy_choice(self, r, nf, nb, pending_w):
        t = self.free[r]
        options = []  # (start, priority, kind, microbatch)
        if nb < nf:
            ready = self.ready_s("B", nb, r)
            if ready is not None:
                options.append((max(ready, t), 0, "B", nb))
        if nf < self.m and nf - nb < self.ranks - r:
            ready = self.ready_s("F", nf, r)
            if ready is not None:
                options.append((max(ready, t), 1, "F", nf))
        if pending_w:
            options.append((t, 2, "W", pending_w[0]))
        if not options:
            return None
        earliest = min(o[0] for o in options)
        start, _, kind, i = min((o for o in options if o[0] <= earliest), key=lambda o: o[1])
        return start, kind, i
