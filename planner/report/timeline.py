"""Pipeline timelines: when each stage runs which micro-batch's forward and backward.

The op *order* of each schedule is taken from its paper; the op *durations* are the estimate's
per-micro-batch forward/backward times of each stage (nothing is costed here). The cost model's
step timeline (cost_models.timeline) places every op at the earliest time its rank is free and its
inputs have arrived, so the idle gaps in the chart are the pipeline bubble that order implies.

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

from cost_models import timeline as TL

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
    """Simulate `schedule` on len(stage_times) ranks with `microbatches` micro-batches: the step
    timeline of the cost model (cost_models.timeline.simulate, the one scheduler), without its
    data-parallel streams.

    `p2p_s` is the send/receive time of one activation (or gradient) between adjacent stages,
    blocking on the sender as Megatron's 1F1B sends are.
    """
    ranks = len(stage_times)
    if ranks < 1 or microbatches < 1:
        raise ValueError(f"need at least one rank and one micro-batch, got {ranks}, {microbatches}")
    work = TL.StepWork(
        schedule=schedule,
        microbatches=microbatches,
        chunks=virtual_stages,
        ranks=tuple(
            TL.RankWork(
                fwd_s=t.forward_s,
                bwd_s=t.backward_s,
                weight_grad_fraction=t.weight_grad_fraction,
            )
            for t in stage_times
        ),
        hop_s=p2p_s if ranks > 1 else 0.0,
    )
    step = TL.simulate(work)
    chunks = virtual_stages if schedule == "interleaved-1f1b" else 1
    ops = (
        Op(
            rank=o.rank,
            kind=o.kind,
            microbatch=o.microbatch,
            chunk=o.chunk,
            start_s=o.start_s,
            end_s=o.end_s,
        )
        for o in step.ops
    )
    return Timeline(
        schedule=schedule,
        ranks=ranks,
        microbatches=microbatches,
        chunks=chunks,
        ops=tuple(sorted(ops, key=lambda o: (o.rank, o.start_s))),
    )
