"""The candidate space: every valid way to split one training step over the world size, as arrays.

Generators of valid values per knob (divisors of the world size that also divide the heads, pipeline
depths no deeper than the blocks, micro-batches that divide each replica's share of the global
batch) are combined per degree triple with a numpy meshgrid (Calculon's search, minus its twelve
nested loops). The result is one numpy array per knob, the layout `planner.score.score` takes.

Validity rules (each rejected combination is counted under its reason):
- tp must divide the heads, and the key/value heads must divide tp or be divided by it
  (Megatron splits whole heads; GQA replicates K/V heads when tp > kv_heads);
- pp * virtual_stages <= blocks (every stage holds at least one block);
- dp * micro_batch must divide the global batch;
- looped schedules (interleaved-1f1b, zero-bubble) need num_microbatches to be a multiple of
  max(1, num_microbatches // pp) (torch.distributed.pipelining's flexible interleaving rule,
  ScheduleInterleaved1F1B; Megatron's stricter num_microbatches % pp == 0 is a special case);
- memory: candidates that do not fit are scored but not ranked (search.py prunes by a lower bound).

Equivalences removed (not errors, just duplicates): with pp = 1 every schedule is the same
gradient-accumulation loop (kept as 1f1b); with dp = 1 ZeRO shards nothing (kept as 0); with
tp = 1 sequence parallelism does nothing (kept off); placements that only move a degree-1 axis
give the same rank layout (the first permutation of each layout is kept).
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES, ParallelConfig

try:  # the scorer's placement vocabulary (helper C); the same six permutations otherwise
    from planner.placement import PLACEMENTS
except ImportError:  # pragma: no cover - until planner.placement lands
    PLACEMENTS = tuple("".join(p) for p in itertools.permutations("DPT"))

FIELDS = ("dp", "tp", "pp", "micro_batch", "virtual_stages", "zero", "recompute", "offload",
          "sequence_parallel", "schedule", "placement")
"""Array names of a candidate batch (the CandidateArrays fields of planner.score)."""

LOOPED_SCHEDULES = ("interleaved-1f1b", "zero-bubble")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """Which values the search may try for each knob (defaults: all of them)."""

    schedules: tuple[str, ...] = SCHEDULES
    """Pipeline schedules to try when pp > 1."""
    max_virtual_stages: int = 8
    """Largest interleaving degree v tried for interleaved-1f1b (2..max)."""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    offload: tuple[str, ...] = OFFLOAD
    sequence_parallel: tuple[bool, ...] = (False, True)
    placements: tuple[str, ...] = PLACEMENTS
    max_micro_batch: int = 64
    """Largest micro-batch tried (sequences)."""
    max_tp: int | None = None
    """Largest tensor-parallel degree tried; None means any divisor of the heads."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidates:
    """A batch of candidates, one entry per configuration in each array (see FIELDS)."""

    arrays: Mapping[str, np.ndarray]
    """dp, tp, pp, micro_batch, virtual_stages, zero (ints); recompute, offload, schedule, placement
    (indices into RECOMPUTE, OFFLOAD, SCHEDULES, PLACEMENTS); sequence_parallel (bool)."""
    global_batch: int
    rejected: Mapping[str, int] = field(default_factory=dict)
    """Combinations left out, by reason."""

    def __len__(self) -> int:
        return int(self.arrays["dp"].shape[0])

    def take(self, index) -> "Candidates":
        return Candidates(arrays={k: v[index] for k, v in self.arrays.items()}, global_batch=self.global_batch,
                          rejected=self.rejected)

    def config(self, i: int, *, seq: int, precision: str, optimizer: str = "adamw",
               stages: tuple[int, ...] = ()) -> ParallelConfig:
        """Candidate i as a ParallelConfig."""
        a = {k: v[i].item() for k, v in self.arrays.items()}
        return ParallelConfig(dp=a["dp"], tp=a["tp"], pp=a["pp"], micro_batch=a["micro_batch"],
                              global_batch=self.global_batch, schedule=SCHEDULES[a["schedule"]],
                              virtual_stages=a["virtual_stages"], zero=a["zero"],
                              recompute=RECOMPUTE[a["recompute"]], offload=OFFLOAD[a["offload"]],
                              sequence_parallel=bool(a["sequence_parallel"]), placement=PLACEMENTS[a["placement"]],
                              precision=precision, optimizer=optimizer, seq=seq, stages=stages)


def divisors(n: int) -> list[int]:
    """Positive divisors of n in increasing order."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_allowed(tp: int, heads: int, kv_heads: int) -> bool:
    """Megatron splits whole heads: tp | heads, and K/V heads split (tp | kv) or replicated (kv | tp)."""
    return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


def degree_triples(world_size: int, global_batch: int, *, heads: int, kv_heads: int, blocks: int,
                   max_tp: int | None = None, rejected: Counter | None = None) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) with dp*tp*pp = world_size that the model shape and the global batch allow."""
    rejected = rejected if rejected is not None else Counter()
    triples = []
    for tp, pp in itertools.product(divisors(world_size), repeat=2):
        if world_size % (tp * pp):
            continue
        dp = world_size // (tp * pp)
        if not tp_allowed(tp, heads, kv_heads) or (max_tp is not None and tp > max_tp):
            rejected["tp does not divide the heads (degree triples)"] += 1
        elif pp > blocks:
            rejected["pp exceeds the blocks (degree triples)"] += 1
        elif global_batch % dp:
            rejected["dp does not divide the global batch (degree triples)"] += 1
        else:
            triples.append((dp, tp, pp))
    return triples


def distinct_placements(dp: int, tp: int, pp: int, allowed: tuple[str, ...] = PLACEMENTS) -> list[int]:
    """Indices into PLACEMENTS of the placements with distinct rank layouts for these degrees."""
    degree = {"D": dp, "P": pp, "T": tp}
    seen, keep = set(), []
    for index, placement in enumerate(PLACEMENTS):
        if placement not in allowed:
            continue
        reduced = "".join(letter for letter in placement if degree[letter] > 1)
        if reduced not in seen:
            seen.add(reduced)
            keep.append(index)
    return keep


def generate(world_size: int, global_batch: int, *, heads: int, kv_heads: int | None = None, blocks: int,
             space: SearchSpace = SearchSpace()) -> Candidates:
    """All valid candidates for a world size and global batch, as arrays (module docstring)."""
    kv_heads = kv_heads or heads
    rejected: Counter = Counter()
    parts: list[np.ndarray] = []
    for dp, tp, pp in degree_triples(world_size, global_batch, heads=heads, kv_heads=kv_heads, blocks=blocks,
                                     max_tp=space.max_tp, rejected=rejected):
        block = _triple_grid(dp, tp, pp, global_batch, blocks, space, rejected)
        if block is not None:
            parts.append(block)
    columns = np.concatenate(parts, axis=1) if parts else np.zeros((len(FIELDS), 0), dtype=np.int64)
    arrays = {name: columns[i] for i, name in enumerate(FIELDS)}
    arrays["sequence_parallel"] = arrays["sequence_parallel"].astype(bool)
    return Candidates(arrays=arrays, global_batch=global_batch, rejected=dict(rejected))


def _schedule_options(pp: int, blocks: int, space: SearchSpace) -> list[tuple[int, int]]:
    """(schedule index, virtual stages) pairs for a pipeline depth."""
    if pp == 1:
        return [(SCHEDULES.index("1f1b"), 1)]
    options = []
    for name in space.schedules:
        if name == "interleaved-1f1b":
            options += [(SCHEDULES.index(name), v) for v in range(2, space.max_virtual_stages + 1)
                        if pp * v <= blocks]
        else:
            options.append((SCHEDULES.index(name), 1))
    return options


def _triple_grid(dp: int, tp: int, pp: int, global_batch: int, blocks: int, space: SearchSpace,
                 rejected: Counter) -> np.ndarray | None:
    """Meshgrid of every knob for one degree triple, invalid combinations masked out; shape (FIELDS, n)."""
    micro = np.array([b for b in divisors(global_batch // dp) if b <= space.max_micro_batch])
    sched = np.array(_schedule_options(pp, blocks, space))
    zero = np.array([z for z in space.zero if dp > 1 or z == 0] or [0])
    sp = np.array([s for s in space.sequence_parallel if tp > 1 or not s] or [False], dtype=np.int64)
    place = np.array(distinct_placements(dp, tp, pp, space.placements) or [0])
    recompute = np.array([RECOMPUTE.index(r) for r in space.recompute])
    offload = np.array([OFFLOAD.index(o) for o in space.offload])
    if micro.size == 0 or sched.size == 0:
        return None
    grid = np.meshgrid(micro, np.arange(len(sched)), zero, recompute, offload, sp, place, indexing="ij")
    mb, si, z, rc, off, s, pl = (g.ravel() for g in grid)
    schedule, virtual = sched[si, 0], sched[si, 1]
    m = global_batch // (dp * mb)
    looped = np.isin(schedule, [SCHEDULES.index(n) for n in LOOPED_SCHEDULES])
    rounds = np.maximum(1, m // pp)
    ok = ~looped | (m % rounds == 0)
    if (~ok).any():
        rejected["num_microbatches not a multiple of the schedule's rounds (candidates)"] += int((~ok).sum())
    n = int(ok.sum())
    if n == 0:
        return None
    full = lambda value: np.full(n, value, dtype=np.int64)  # noqa: E731
    return np.stack([full(dp), full(tp), full(pp), mb[ok], virtual[ok], z[ok], rc[ok], off[ok], s[ok],
                     schedule[ok], pl[ok]]).astype(np.int64)
