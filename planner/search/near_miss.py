"""Near-miss plans: candidates whose even stage split misses the memory but whose binding pipeline
rank could shed enough blocks to fit. Each is re-split under a memory cap (planner.partition.split on
refine.stage_problem), re-scored with estimate(), and joins the ranking with its uneven `stages`
when estimate() says it fits.

What is covered. The main pass scores every candidate whose time bound is below the admission
threshold, which only falls (planner.search's docstring), so every plan whose even-split step is
below the `leaders`-th fitting step was scored, fitting or not, except the sequence-parallel-off
twins of plans that miss with it on (they never need less memory). Of those scored plans with
pp > 1 on a framework that runs uneven stages (capabilities.uneven_stages), fastest by their
even-split closed-form step first and distinct up to the placement (which stage_problem does not
read), the ones whose miss the binding rank can shed (`recoverable_peak_bytes`) and whose other
ranks have room for what is shed (`spare_blocks`, on estimate()'s memory of every rank) are
re-split, at most NEAR_MISS_TOP of the first NEAR_MISS_EVEN_ESTIMATES that pass the first bound.
Both bounds take a rank's bytes as linear in its blocks at stage_problem's per-block bytes; a plan
they exclude cannot fit under any contiguous split in that model. A slower near-miss is not tried.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cost_models.memory import allocator_overhead, largest_fitting_peak
from planner.errors import ConfigError
from planner.parallel import ParallelConfig
from planner.partition import PartitionProblem, even_split, split
from planner.search.refine import CPSAT_TIME_LIMIT_S, Refiner, splittable, stage_problem
from planner.search.request import Setup
from planner.search.results import NearMisses, ScoredSpace
from planner.search.space import MEMORY_OBJECTIVE_SLACK

NEAR_MISS_TOP = 4
"""Near-miss plans re-split per search, fastest even-split step first (each costs a few estimate()
calls; with it the searches of benchmarks/search_speed.py took 1.0-1.2x their CPU time)."""

NEAR_MISS_SCAN = 64
"""Scored rows examined for the binding rank's bound, fastest first (one stage_problem each)."""

NEAR_MISS_EVEN_ESTIMATES = 2 * NEAR_MISS_TOP
"""Even splits documented by estimate() (every rank's memory) for the room bound (spare_blocks)."""

RESPLIT_TRIES = 3
"""Splits tried per near-miss: the cap is tightened by what estimate() still finds over it."""


def entry_threshold_s(scored: ScoredSpace, order: np.ndarray, objective: str, leaders: int):
    """The even-split step a near-miss must beat to join the ranking: the `leaders`-th fitting step
    (the memory objective: the fastest plus MEMORY_OBJECTIVE_SLACK, its ranking's window); with
    fewer fitting plans, none (inf)."""
    steps = np.sort(scored.step_time_s[order])
    if objective == "memory":
        return steps[0] * (1 + MEMORY_OBJECTIVE_SLACK) if len(steps) else np.inf
    return float(steps[leaders - 1]) if len(steps) >= leaders else np.inf


def near_miss_rows(scored: ScoredSpace, threshold_s: float) -> np.ndarray:
    """Rows that miss the memory with pp > 1 and a finite even-split step below the threshold,
    fastest first (at most NEAR_MISS_SCAN)."""
    step = scored.step_time_s
    pp = np.asarray(scored.arrays["pp"])
    miss = np.flatnonzero(~scored.fits & (pp > 1) & np.isfinite(step) & (step < threshold_s))
    return miss[np.argsort(step[miss], kind="stable")][:NEAR_MISS_SCAN]


def recoverable_peak_bytes(problem: PartitionProblem) -> float:
    """Upper bound on what re-splitting can take off the binding rank's peak. Every rank keeps at
    least one block per chunk (v blocks), so the binding rank sheds at most n_r - v of its n_r
    blocks, each holding its static bytes plus inflight_r micro-batches of activations; inflight is
    largest on rank 0 (1F1B: pp micro-batches, Narayanan et al. 2021 Sec. 2.2). So the bound is
    (max_r n_r - v) x (static + max inflight x activation) per block, at the even split."""
    per_block = max(
        s + problem.inflight_per_chunk.max() * a
        for s, a in zip(problem.block_static_bytes, problem.block_activation_bytes)
    )
    return float((_rank_blocks(problem).max() - problem.virtual_stages) * per_block)


def allowed_peak_bytes(setup: Setup) -> float:
    """The largest peak that fits (cost_models.memory.largest_fitting_peak)."""
    return largest_fitting_peak(setup.hardware, setup.software)


def near_misses(
    scored: ScoredSpace, setup: Setup, refiner: Refiner, threshold_s: float
) -> NearMisses:
    """Re-split the near-miss plans (module docstring); those that fit are returned as documents."""
    if not setup.software.framework.capabilities.uneven_stages:
        return NearMisses()
    allowed = allowed_peak_bytes(setup)
    overhead = 1.0 + allocator_overhead(setup.software)
    seen, docs, rows, closest, tried, looked = set(), [], [], None, 0, 0
    for i in near_miss_rows(scored, threshold_s):
        cfg = setup.workload.config(scored.arrays, int(i))
        twin = _placement_free(cfg)
        if twin in seen or not splittable(cfg):
            continue
        seen.add(twin)
        problem = stage_problem(setup.model, cfg, setup.software)
        miss = (float(scored.needed_bytes[i]) - scored.capacity_bytes) / overhead
        if miss > recoverable_peak_bytes(problem):
            continue
        looked += 1
        even_doc = refiner.plan_document(cfg)
        peaks = _rank_peaks(even_doc)
        if even_doc["prediction"]["memory"]["fits"]:  # estimate() decides fit: it joins as it is
            docs.append(even_doc)
            rows.append(int(i))
        elif spare_blocks(problem, peaks, allowed):
            tried += 1
            doc, missed = resplit(refiner, cfg, problem, (peaks, allowed))
            if doc is not None:
                docs.append(doc)
                rows.append(int(i))
            elif missed is not None and (closest is None or _needed(missed) < _needed(closest)):
                closest = missed
        if tried == NEAR_MISS_TOP or looked == NEAR_MISS_EVEN_ESTIMATES:
            break
    return NearMisses(documents=tuple(docs), rows=tuple(rows), resplit=tried, closest=closest)


def spare_blocks(problem: PartitionProblem, peaks: np.ndarray, allowed: float) -> bool:
    """Whether the ranks' room, counted in blocks, covers what the ranks over the memory must shed
    (a necessary condition for a split that fits, with a rank's bytes linear in its blocks). Rank
    r, at `peaks[r]` with the even split's n_r blocks, can take floor((allowed - peak_r) / take_r)
    more blocks or must shed ceil((peak_r - allowed) / shed_r), at most n_r - v of them (one block
    per chunk stays); a block costs its static bytes plus the micro-batches its chunk holds in
    flight (take_r: the fewest of r's chunks, shed_r: the most; 1F1B: pp - r, Narayanan et al.
    2021 Sec. 2.2) times its activations. A split exists only if the room is at least the excess."""
    inflight = problem.inflight_per_chunk.reshape(problem.virtual_stages, problem.pp)
    static, act = np.asarray(problem.block_static_bytes), np.asarray(problem.block_activation_bytes)
    take = static.min() + inflight.min(axis=0) * act.min()
    shed = static.max() + inflight.max(axis=0) * act.max()
    over = peaks > allowed
    room = np.floor(np.maximum(allowed - peaks, 0.0) / take)
    excess = np.ceil(np.maximum(peaks - allowed, 0.0) / shed)
    keep = _rank_blocks(problem) - problem.virtual_stages
    return bool(np.all(excess[over] <= keep[over]) and room.sum() >= excess.sum())


def resplit(refiner: Refiner, cfg: ParallelConfig, problem: PartitionProblem, even):
    """(document that fits, None) or (None, closest miss or None): cfg split under a memory cap,
    `even` = (every rank's peak at the even split, the largest peak that fits). stage_problem's bytes
    leave out what is not a block's or the ends' own (workspace, transients, weight caches, buffers);
    their per-rank amount at the even split -- estimate()'s rank peak less the problem's rank bytes --
    is taken off the cap (the middle ranks' largest) and added to the first and last stage's static
    bytes (their own excess). estimate() decides fit; while a split still misses, the cap falls by
    the miss (at most RESPLIT_TRIES splits)."""
    peaks, allowed = even
    offsets = peaks - problem.stage_costs(even_split(problem.blocks, problem.chunks))[1]
    middle = offsets[1:-1] if len(offsets) > 2 else offsets[[0, -1]].min(keepdims=True)
    base = float(middle.max())
    capped = replace(
        problem,
        first_static_bytes=problem.first_static_bytes + offsets[0] - base,
        last_static_bytes=problem.last_static_bytes + offsets[-1] - base,
        capacity_bytes=allowed - base,
    )
    closest = None
    for _ in range(RESPLIT_TRIES):
        try:
            stages = split(capped, time_limit_s=CPSAT_TIME_LIMIT_S).stages
        except ConfigError:  # no contiguous split under the cap
            break
        doc = refiner.plan_document(replace(cfg, stages=stages))
        if doc["prediction"]["memory"]["fits"]:
            return doc, None
        closest = doc if closest is None or _needed(doc) < _needed(closest) else closest
        over = doc["prediction"]["memory"]["peak_bytes_per_gpu"] - allowed
        capped = replace(capped, capacity_bytes=capped.capacity_bytes - max(over, 1.0))
    return None, closest


def _rank_peaks(doc: dict) -> np.ndarray:
    """estimate()'s peak of every pipeline rank, rank 0 first."""
    return np.array(
        [r["peak_bytes_per_gpu"] for r in doc["prediction"]["memory_per_rank"]], dtype=float
    )


def _rank_blocks(problem: PartitionProblem) -> np.ndarray:
    """Blocks of every pipeline rank at the even split (chunk c on rank c % pp)."""
    per_rank = np.zeros(problem.pp)
    np.add.at(
        per_rank, np.arange(problem.chunks) % problem.pp, even_split(problem.blocks, problem.chunks)
    )
    return per_rank


def _placement_free(cfg: ParallelConfig) -> tuple:
    return tuple(
        (k, tuple(v) if isinstance(v, list) else v)
        for k, v in cfg.to_dict().items()
        if k != "placement"
    )


def _needed(doc: dict) -> float:
    return float(doc["prediction"]["memory"]["needed_bytes"])
