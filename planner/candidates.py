"""The candidate space: every valid way to split one training step over the world size, as arrays.

Generators of valid values per knob (divisors of the world size that also divide the heads, pipeline
depths no deeper than the blocks, micro-batches that divide each replica's share of the global
batch) are combined per degree triple with a numpy meshgrid (Calculon's search, minus its twelve
nested loops). The result is one numpy array per knob, the layout `planner.score.score` takes.

Validity rules (each rejected combination is counted under its reason):
- tp must divide the heads, and the key/value heads must divide tp or be divided by it
  (Megatron splits whole heads and whole K/V groups: heads % tp == 0 and kv_heads % tp == 0,
  as megatron.core asserts for num_query_groups; replicating K/V heads is not costed);
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

from planner.parallel import LOOPED_SCHEDULES, OFFLOAD, RECOMPUTE, SCHEDULES, ParallelConfig, looped_rounds_ok

try:  # the scorer's placement vocabulary (helper C); the same six permutations otherwise
    from planner.placement import PLACEMENTS
except ImportError:  # pragma: no cover - until planner.placement lands
    PLACEMENTS = tuple("".join(p) for p in itertools.permutations("DPT"))

FIELDS = ("dp", "tp", "pp", "micro_batch", "virtual_stages", "zero", "recompute", "offload",
          "sequence_parallel", "schedule", "placement")
"""Array names of a candidate batch (the CandidateArrays fields of planner.score)."""



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
    max_pp: int | None = None
    """Largest pipeline degree tried; None means up to the blocks."""
    zero_with_pp: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages tried together with pp > 1."""

    def for_framework(self, framework) -> "SearchSpace":
        """This space narrowed to what `framework` can run (frameworks.FrameworkProfile.capabilities;
        the same capabilities frameworks.rules.violations checks for estimate and export)."""
        from dataclasses import replace

        from frameworks.rules import placement_allowed

        caps = framework.capabilities
        sp = {"optional": self.sequence_parallel, "always": (True,), "never": (False,)}[caps.sequence_parallel]
        return replace(
            self, schedules=tuple(s for s in self.schedules if s in caps.schedules),
            max_virtual_stages=min(self.max_virtual_stages, caps.max_virtual_stages),
            zero=tuple(z for z in self.zero if z in caps.zero) or (0,),
            zero_with_pp=tuple(z for z in self.zero_with_pp if z in caps.zero_with_pp),
            recompute=tuple(r for r in self.recompute if r in caps.recompute),
            # activation offload that excludes pipelining and recompute (Megatron-Core) is left to estimate:
            # the search crosses offload with every pipeline depth and recompute level
            offload=tuple(o for o in self.offload if o in caps.offload
                          and (o != "activations" or caps.activation_offload == "any")), sequence_parallel=sp,
            placements=tuple(p for p in self.placements if placement_allowed(framework, p)),
            max_tp=self.max_tp if caps.tp else 1, max_pp=self.max_pp if caps.schedules else 1)


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
    """Megatron splits whole heads and whole K/V groups: tp divides heads and kv_heads."""
    return heads % tp == 0 and kv_heads % tp == 0


def degree_triples(world_size: int, global_batch: int, *, heads: int, kv_heads: int, blocks: int,
                   max_tp: int | None = None, max_pp: int | None = None,
                   rejected: Counter | None = None) -> list[tuple[int, int, int]]:
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
        elif max_pp is not None and pp > max_pp:
            rejected["pp above what the framework runs (degree triples)"] += 1
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


SKELETON_FIELDS = ("dp", "tp", "pp", "schedule", "virtual_stages", "zero", "offload")
"""Knobs that set the static memory (weights, gradients, optimizer states) and the pipeline's in-flight
count; the others (micro-batch, recompute, sequence parallelism, placement) only add activations or
time, which is what makes a skeleton's leanest candidate a memory lower bound for all of its expansions."""


def generate(world_size: int, global_batch: int, *, heads: int, kv_heads: int | None = None, blocks: int,
             space: SearchSpace = SearchSpace()) -> Candidates:
    """All valid candidates for a world size and global batch, as arrays (module docstring)."""
    rejected: Counter = Counter()
    rows = skeleton_rows(world_size, global_batch, heads=heads, kv_heads=kv_heads, blocks=blocks, space=space,
                         rejected=rejected)
    rows = with_micro_batches(rows, global_batch, space=space, rejected=rejected)
    return Candidates(arrays=with_free_knobs(rows, space=space), global_batch=global_batch, rejected=dict(rejected))


def skeleton_rows(world_size: int, global_batch: int, *, heads: int, kv_heads: int | None, blocks: int,
                  space: SearchSpace, rejected: Counter) -> dict[str, np.ndarray]:
    """One row per (dp, tp, pp, schedule, virtual stages, zero, offload) the rules allow."""
    kv_heads = kv_heads or heads
    parts = []
    offload = [OFFLOAD.index(o) for o in space.offload]
    for dp, tp, pp in degree_triples(world_size, global_batch, heads=heads, kv_heads=kv_heads, blocks=blocks,
                                     max_tp=space.max_tp, max_pp=space.max_pp, rejected=rejected):
        zero = [z for z in space.zero if (dp > 1 or z == 0) and (pp == 1 or dp == 1 or z in space.zero_with_pp)]
        if not zero:
            rejected["no ZeRO stage the framework runs with pipelining (skeletons)"] += 1
            continue
        for (schedule, virtual), z, off in itertools.product(_schedule_options(pp, blocks, space), zero, offload):
            parts.append((dp, tp, pp, schedule, virtual, z, off))
    table = np.array(parts, dtype=np.int64).reshape(-1, len(SKELETON_FIELDS))
    return {name: table[:, i] for i, name in enumerate(SKELETON_FIELDS)}


def _size(rows: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(rows.values())).shape[0])


def _product(rows: Mapping[str, np.ndarray], name: str, values: np.ndarray) -> dict[str, np.ndarray]:
    """Every row combined with every value of a new knob (rows outer, values inner)."""
    n, k = _size(rows), len(values)
    out = {key: np.repeat(col, k) for key, col in rows.items()}
    out[name] = np.tile(np.asarray(values, dtype=np.int64), n)
    return out


def _concat(parts: list[dict[str, np.ndarray]], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not parts:
        return {name: np.zeros(0, dtype=np.int64) for name in names}
    return {name: np.concatenate([p[name] for p in parts]) for name in names}


def with_micro_batches(rows: Mapping[str, np.ndarray], global_batch: int, *, space: SearchSpace,
                       rejected: Counter | None = None) -> dict[str, np.ndarray]:
    """Each row combined with every micro-batch that divides its replica's share of the global batch;
    looped schedules keep only micro-batch counts torch's interleaving accepts."""
    rejected = rejected if rejected is not None else Counter()
    parts = []
    for dp in np.unique(rows["dp"]):
        mine = {k: v[rows["dp"] == dp] for k, v in rows.items()}
        micro = np.array([b for b in divisors(global_batch // int(dp)) if b <= space.max_micro_batch], dtype=np.int64)
        if micro.size == 0:
            continue
        grid = _product(mine, "micro_batch", micro)
        m = global_batch // (grid["dp"] * grid["micro_batch"])
        looped = np.isin(grid["schedule"], [SCHEDULES.index(n) for n in LOOPED_SCHEDULES])
        ok = ~looped | looped_rounds_ok(m, grid["pp"])
        if (~ok).any():
            rejected["num_microbatches not a multiple of the schedule's rounds (micro-batch choices)"] += int((~ok).sum())
        parts.append({k: v[ok] for k, v in grid.items()})
    return _concat(parts, tuple(rows) + ("micro_batch",))


def _pattern_groups(rows: Mapping[str, np.ndarray]):
    """Rows grouped by which degrees exceed 1 (what placements and sequence parallelism depend on)."""
    key = (rows["dp"] > 1) * 4 + (rows["tp"] > 1) * 2 + (rows["pp"] > 1)
    for pattern in np.unique(key):
        yield bool(pattern & 4), bool(pattern & 2), bool(pattern & 1), key == pattern


def with_free_knobs(rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> dict[str, np.ndarray]:
    """Complete candidates: each row combined with every recompute, sequence-parallel and placement choice."""
    recompute = np.array([RECOMPUTE.index(r) for r in space.recompute], dtype=np.int64)
    parts = []
    for has_dp, has_tp, has_pp, mask in _pattern_groups(rows):
        mine = {k: v[mask] for k, v in rows.items()}
        sp = np.array([s for s in space.sequence_parallel if has_tp or not s] or [False], dtype=np.int64)
        place = np.array(distinct_placements(1 + has_dp, 1 + has_tp, 1 + has_pp, space.placements) or [0])
        parts.append(_product(_product(_product(mine, "recompute", recompute), "sequence_parallel", sp),
                              "placement", place))
    out = _concat(parts, tuple(rows) + ("recompute", "sequence_parallel", "placement"))
    out["sequence_parallel"] = out["sequence_parallel"].astype(bool)
    return {name: out[name] for name in FIELDS}


def leanest(rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> dict[str, np.ndarray]:
    """Complete each row with the values that hold the least memory, once per recompute level:
    micro-batch 1 (when absent), sequence parallelism where tp > 1, any placement (placement moves
    no memory). Row i's completions are entries i*k .. i*k+k-1 (k recompute levels); the least of
    their peaks bounds from below the peak of every candidate that shares the row. Every recompute
    level is tried because the strongest is not always the leanest (with activation offload, full
    recompute's working set can exceed what selective keeps); tests/test_search.py checks the bound
    on the real scorer."""
    n = _size(rows)
    out = {k: np.asarray(v) for k, v in rows.items()}
    if "micro_batch" not in out:
        out["micro_batch"] = np.ones(n, dtype=np.int64)
    out["sequence_parallel"] = (out["tp"] > 1) & (True in space.sequence_parallel)
    first = np.zeros(n, dtype=np.int64)
    for has_dp, has_tp, has_pp, mask in _pattern_groups(out):
        first[mask] = (distinct_placements(1 + has_dp, 1 + has_tp, 1 + has_pp, space.placements) or [0])[0]
    out["placement"] = first
    out.pop("recompute", None)
    out = _product(out, "recompute", np.array([RECOMPUTE.index(r) for r in space.recompute]))
    return {name: out[name] for name in FIELDS}


def leanest_peak(peaks: np.ndarray, rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> np.ndarray:
    """Per row, the least peak over its `leanest` completions."""
    return np.asarray(peaks, dtype=float).reshape(_size(rows), len(space.recompute)).min(axis=1)


def free_knob_count(rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> np.ndarray:
    """Per row (with micro_batch), how many complete candidates `with_free_knobs` makes of it."""
    count = np.zeros(_size(rows), dtype=np.int64)
    for has_dp, has_tp, has_pp, mask in _pattern_groups(rows):
        sp = len([s for s in space.sequence_parallel if has_tp or not s] or [False])
        place = len(distinct_placements(1 + has_dp, 1 + has_tp, 1 + has_pp, space.placements) or [0])
        count[mask] = len(space.recompute) * sp * place
    return count


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
