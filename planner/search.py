"""Strategy search: every valid candidate scored at once by the vectorized cost model, then ranked.

Pipeline (docs/style.md's one-way flow): candidates (planner.candidates) -> memory lower bounds ->
vectorized scores (planner.score.score, numpy over arrays) -> ranking by the objective -> uneven
stages for the leaders (planner.partition) re-scored with the scalar `estimate()` -> plan documents.

Pruning by memory lower bounds, in two levels. A "skeleton" (dp, tp, pp, schedule, v, ZeRO, offload)
fixes the static memory; its leanest completion (micro-batch 1, strongest recompute, sequence
parallelism, any placement) holds the least memory of all its expansions, so a skeleton whose leanest
candidate does not fit is dropped without expanding it. The survivors get their micro-batches and the
same bound is taken per (skeleton, micro-batch); only then are recompute, sequence parallelism and
placement expanded and scored. Bound rows are scored by the same `score()`. Recompute only adds time,
Then a time bound: for each (skeleton, micro-batch, placement) group the candidate with the weakest
recompute and sequence parallelism on (where tp > 1) is scored first; its compute + bubble + p2p +
optimizer time is the least of the group (each grows with recompute and shrinks with sequence
parallelism) and no step is shorter than that sum, so the rest of the group is scored only if the sum is
below the threshold that
admits a candidate to the result: the `keep`-th best feasible step among the firsts (throughput,
cost) or the best step plus 5 % (memory). tests/test_search.py checks these premises on the real scorer.

Objectives:
- throughput: least step time among the candidates that fit (default);
- cost: least dollars per 1B tokens at the profile's on-demand (or `spot`) node price; with the world
  size fixed this orders candidates as throughput does, and the plan carries the dollar figures;
- memory: least peak memory per GPU among candidates within 5 % of the best step time;
- time-to-train: least expected wall time of a run of `tokens` tokens under failures, checkpoints and
  restarts (planner.goodput, docs/goodput.md); candidates enter by step time as for throughput and the
  leaders' documents are ranked by their goodput-adjusted time. With `tokens`, cost also ranks the
  leaders by their goodput-adjusted dollars, and every plan document carries its goodput.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from planner.candidates import (FIELDS, SearchSpace, _product, free_knob_count, leanest, leanest_peak,
                                skeleton_rows, with_free_knobs, with_micro_batches)
from planner.errors import ConfigError, NoFitError
from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES, ParallelConfig, resolve_precision
from planner.placement import PLACEMENTS

OBJECTIVES = ("throughput", "cost", "memory", "time-to-train")
MEMORY_OBJECTIVE_SLACK = 0.05
"""The memory objective accepts candidates up to 5 % slower than the fastest."""
DEFAULT_BATCH_TOKENS = 2 ** 21
"""Default global batch, in tokens: about 2M, inside GPT-3's 0.5M-3.2M range (Brown et al. 2020,
Table 2.1) and Llama 2's 4M (Touvron et al. 2023); rounded up to a multiple of the world size."""
SCORE_CHUNK = 262_144
"""Candidates scored per call (bounds the scorer's temporary arrays; one progress tick each)."""
CPSAT_MAX_CHUNKS = 16
"""Interleaved candidates with more chunks than this keep the even split (CP-SAT grows slow there)."""
CPSAT_TIME_LIMIT_S = 1.0
REFINE_TOP = 8
TIME_BOUND_TERMS = ("compute", "bubble", "pp_p2p", "optimizer")
"""Step-time terms of planner.score that are least, within a group, for the weakest recompute with
sequence parallelism on, and whose sum never exceeds the step (checked in tests/test_search.py).
Exposed data-parallel and offload time are left out: more recompute can hide them."""
"""Leading candidates whose pipeline stages are re-split unevenly and re-scored with estimate()."""


def default_global_batch(world_size: int, seq: int) -> int:
    """About DEFAULT_BATCH_TOKENS tokens, as a multiple of the world size (so every dp divides it).

    >>> default_global_batch(960, 2048)
    1920
    >>> default_global_batch(8, 4096)
    512
    """
    sequences = max(1, DEFAULT_BATCH_TOKENS // seq)
    return world_size * math.ceil(sequences / world_size)


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchStats:
    """What the search did."""

    candidates_evaluated: int
    """Complete candidates scored by the vectorized cost model."""
    feasible: int
    """Of those, candidates that fit in memory."""
    seconds: float
    """Wall time of the whole search (generation, bounds, scoring, partitioning, documents)."""
    space: int = 0
    """Valid candidates in the space: scored plus pruned by a memory bound."""
    pruned_by_memory_bound: int = 0
    """Candidates never expanded because their skeleton's leanest completion does not fit."""
    pruned_by_time_bound: int = 0
    """Candidates not scored because their compute time alone exceeds what the result admits."""
    bound_evaluations: int = 0
    """Leanest completions scored for the bounds."""
    refined: int = 0
    """Leading candidates re-split into uneven stages and re-scored with estimate()."""
    rejected: Mapping[str, int] = field(default_factory=dict)
    """Combinations outside the rules, by reason."""

    def to_dict(self) -> dict:
        return {"candidates_evaluated": self.candidates_evaluated, "feasible": self.feasible,
                "seconds": round(self.seconds, 4), "space": self.space,
                "pruned_by_memory_bound": self.pruned_by_memory_bound,
                "pruned_by_time_bound": self.pruned_by_time_bound,
                "bound_evaluations": self.bound_evaluations, "refined": self.refined,
                "rejected": dict(self.rejected)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    """The ranked result of a search: the best plan document and the runners-up."""

    objective: str
    best: Mapping[str, Any]
    """Plan document of the winner (estimate().to_document() plus cost, alternatives and search)."""
    alternatives: tuple[Mapping[str, Any], ...]
    """Plan documents of the next candidates, best first."""
    stats: SearchStats
    scored: "ScoredSpace | None" = field(default=None, compare=False, repr=False)
    """Every candidate the search scored (`to_pandas()` for a table of them)."""

    def to_pandas(self):
        """Every scored candidate as a pandas.DataFrame (see `ScoredSpace.to_pandas`)."""
        if self.scored is None:
            raise ValueError("this Recommendation carries no scored candidates")
        return self.scored.to_pandas()

    def to_document(self) -> dict:
        """The `recommend --json` document (docs/cli-contract.md)."""
        return {"schema_version": self.best["schema_version"], "model": self.best["model"],
                "hardware": self.best["hardware"], "objective": self.objective,
                "search": self.stats.to_dict(), "best": dict(self.best),
                "alternatives": [dict(a) for a in self.alternatives]}

    def plan_document(self) -> dict:
        """The winner as a plan file (`recommend --out`): loadable by planner.load_plan."""
        return dict(self.best)


# --------------------------------------------------------------------------------------------- inputs

def _resolve(model, hardware, gpus, nodes, seq):
    if isinstance(model, str):
        from planner.sources import resolve_model
        model = resolve_model(model, seq=seq)
    if getattr(model, "spec", None) is not None and getattr(model, "factory", None):
        from planner.sources import transformer_spec
        model = transformer_spec(model)          # a factory's module that describes its transformer
    elif seq is not None and getattr(model, "seq", seq) != seq:
        from planner.sources import with_seq
        model = with_seq(model, seq)
    if isinstance(hardware, str):
        from hardware_profiles import load_profile
        hardware = load_profile(hardware)
    per_node = hardware.devices_per_node
    if gpus is None and nodes is None:
        raise ConfigError("gpus", None, "--gpus N or --nodes K")
    if gpus is not None and nodes is not None and gpus != nodes * per_node:
        raise ConfigError("gpus", gpus, f"nodes({nodes})*devices_per_node({per_node})={nodes * per_node}, or give one of them")
    world = gpus if gpus is not None else nodes * per_node
    return model, hardware, world, math.ceil(world / per_node)


def _model_shape(model) -> tuple[int, int, int]:
    """(heads, kv_heads, blocks) the degree rules read; models without heads allow tp = 1 only."""
    heads = getattr(model, "heads", None)
    blocks = getattr(model, "total_blocks", None) or getattr(model, "layers", None)
    if isinstance(blocks, (list, tuple)):
        blocks = len(blocks)
    if not heads:
        return 1, 1, int(blocks or 1)
    return int(heads), int(getattr(model, "n_kv_heads", heads)), int(blocks)


def _price_per_hour(hardware, nodes: int, spot: bool, node_price: float | None = None) -> float | None:
    """Dollars per hour for `nodes` nodes: `node_price` (the user's own price: negotiated, reserved or
    today's spot) when given, else the profile's on-demand or spot price."""
    if node_price is not None:
        if not (isinstance(node_price, (int, float)) and math.isfinite(node_price) and node_price > 0):
            raise ConfigError("price-per-hour", node_price, "a positive number of US dollars per node-hour")
        return float(node_price) * nodes
    price = hardware.spot_price_usd_per_hour if spot else hardware.price_usd_per_hour
    if spot and price is None:
        raise ConfigError("spot", True, f"a spot price: {hardware.name}'s profile has none (spot prices move "
                                        "daily); pass today's with --price-per-hour USD (per node)")
    return None if price is None else price * nodes


# -------------------------------------------------------------------------------------------- scoring

class _Scorer:
    """Calls planner.score.score on dicts of candidate arrays, in chunks, counting what it scored."""

    def __init__(self, model, hardware, *, global_batch, seq, precision, optimizer, score_fn=None, software=None):
        if score_fn is None:
            from planner.score import score as score_fn
        self.score_fn = score_fn
        self.kw = dict(global_batch=global_batch, seq=seq, precision=precision, optimizer=optimizer)
        if software is not None:
            self.kw["software"] = software
        self.model, self.hardware = model, hardware

    def __call__(self, arrays: Mapping[str, np.ndarray], progress: Callable[[int], None] | None = None):
        """(step_time_s, peak_bytes_per_gpu, needed_bytes, time lower bound) per candidate. needed_bytes
        is what decides fitting (Scores.needed_bytes: the peak with the allocator's overhead and the CUDA
        context; the peak itself where a scorer handed in by a test reports no more). The bound is the
        sum of the step's terms that only grow with recompute and without sequence parallelism (compute,
        bubble, pipeline p2p, optimizer; TIME_BOUND_TERMS); 0 where the scorer reports none of them."""
        n = len(arrays["dp"])
        step, peak, needed, compute = np.empty(n), np.empty(n), np.empty(n), np.zeros(n)
        for start in range(0, n, SCORE_CHUNK):
            chunk = {k: v[start:start + SCORE_CHUNK] for k, v in arrays.items()}
            scores = self.score_fn(self.model, self.hardware, _candidate_arrays(chunk), **self.kw)
            step[start:start + SCORE_CHUNK] = np.asarray(scores.step_time_s, dtype=float)
            peak[start:start + SCORE_CHUNK] = np.asarray(scores.peak_bytes_per_gpu, dtype=float)
            needed[start:start + SCORE_CHUNK] = np.asarray(getattr(scores, "needed_bytes", scores.peak_bytes_per_gpu),
                                                           dtype=float)
            for term in TIME_BOUND_TERMS:
                if hasattr(scores, term):
                    compute[start:start + SCORE_CHUNK] += np.asarray(getattr(scores, term), dtype=float)
            if progress is not None:
                progress(len(chunk["dp"]))
        return step, peak, needed, compute


def _rest_of_groups(firsts: Mapping[str, np.ndarray], *, space: SearchSpace, weakest: int,
                    sp_first: bool) -> dict[str, np.ndarray]:
    """Each (row, placement) group's other candidates: every recompute level and sequence-parallel
    choice except the (weakest, sp_first) one already scored; sequence parallelism only where tp > 1."""
    levels = np.array([RECOMPUTE.index(r) for r in space.recompute], dtype=np.int64)
    sps = np.array(sorted(set(space.sequence_parallel)), dtype=np.int64)
    grid = _product(_product({k: v for k, v in firsts.items() if k not in ("recompute", "sequence_parallel")},
                             "recompute", levels), "sequence_parallel", sps)
    sp_on = grid["sequence_parallel"].astype(bool)
    valid = (grid["tp"] > 1) | ~sp_on
    # for tp = 1 the only sp value is off, so the scored first is (weakest, off)
    first_sp = np.where(grid["tp"] > 1, sp_first, False)
    already = (grid["recompute"] == weakest) & (sp_on == first_sp)
    out = _take(grid, valid & ~already)
    out["sequence_parallel"] = out["sequence_parallel"].astype(bool)
    return {name: out[name] for name in FIELDS}


def _admission_threshold(step: np.ndarray, needed: np.ndarray, capacity: float, objective: str, keep: int) -> float:
    """Step time above which a candidate cannot enter the result (see the module docstring)."""
    feasible = np.sort(step[needed <= capacity])
    if objective == "memory":
        return feasible[0] * (1 + MEMORY_OBJECTIVE_SLACK) if len(feasible) else np.inf
    return feasible[keep - 1] if len(feasible) >= keep else np.inf


def _candidate_arrays(arrays: Mapping[str, np.ndarray]):
    try:
        from planner.score import CandidateArrays
    except ImportError:  # a scorer handed in by a test takes the dict
        return dict(arrays)
    return CandidateArrays(**{k: np.asarray(arrays[k]) for k in FIELDS})


def _take(rows: Mapping[str, np.ndarray], mask) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in rows.items()}


def config_of(arrays: Mapping[str, np.ndarray], i: int, *, global_batch: int, seq: int, precision: str,
              optimizer: str, stages: tuple[int, ...] = (), framework: str = "megatron") -> ParallelConfig:
    """Row i of candidate arrays as a ParallelConfig."""
    a = {k: np.asarray(arrays[k])[i].item() for k in FIELDS}
    return ParallelConfig(dp=a["dp"], tp=a["tp"], pp=a["pp"], micro_batch=a["micro_batch"],
                          global_batch=global_batch, schedule=SCHEDULES[a["schedule"]],
                          virtual_stages=a["virtual_stages"], zero=a["zero"], recompute=RECOMPUTE[a["recompute"]],
                          offload=OFFLOAD[a["offload"]], sequence_parallel=bool(a["sequence_parallel"]),
                          placement=PLACEMENTS[a["placement"]], precision=precision, optimizer=optimizer,
                          seq=seq, stages=stages, framework=framework)


# ---------------------------------------------------------------------------------------------- search

@dataclass(frozen=True, kw_only=True, slots=True)
class ScoredSpace:
    """Every complete candidate that survived the bounds, with its scores."""

    arrays: Mapping[str, np.ndarray]
    step_time_s: np.ndarray
    peak_bytes_per_gpu: np.ndarray
    needed_bytes: np.ndarray
    """What each candidate needs of the device (Scores.needed_bytes)."""
    capacity_bytes: float
    leanest_arrays: Mapping[str, np.ndarray]
    """The level-1 bound rows (one per skeleton) and what they need: what the NoFit message reads."""
    leanest_needed_bytes: np.ndarray
    stats: SearchStats

    @property
    def fits(self) -> np.ndarray:
        """The cost model's one "fits" (cost_models.memory.fits): needed <= capacity."""
        return self.needed_bytes <= self.capacity_bytes

    def to_pandas(self):
        """One row per scored candidate (index: its position in `arrays`, so `config_of(arrays, i, ...)`
        rebuilds it): the knobs, with schedule, recompute, offload and placement as their names,
        then step_time_s, peak_bytes_per_gpu and fits. For notebooks:
        `planner.recommend("gpt2", "p4d.24xlarge", gpus=8).to_pandas().query("fits")`."""
        import pandas as pd

        names = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "offload": OFFLOAD, "placement": PLACEMENTS}
        columns = {}
        for key, values in self.arrays.items():
            values = np.asarray(values)
            columns[key] = np.asarray(names[key], dtype=object)[values] if key in names else values
        columns["step_time_s"] = np.asarray(self.step_time_s, dtype=float)
        peak = np.asarray(self.peak_bytes_per_gpu, dtype=float)
        columns["peak_bytes_per_gpu"] = peak.round().astype(np.int64) if np.all(np.isfinite(peak)) else peak
        columns["fits"] = np.asarray(self.fits, dtype=bool)
        return pd.DataFrame(columns)


def score_space(model, hardware, *, world_size: int, global_batch: int, seq: int, precision: str,
                optimizer: str, space: SearchSpace = SearchSpace(), score_fn=None, prune: bool = True,
                objective: str = "throughput", keep: int = 10, time_bound: bool = True,
                software=None, progress: Callable[[int, int], None] | None = None) -> ScoredSpace:
    """Generate, bound and score the whole space (module docstring); no ranking yet."""
    t0 = time.perf_counter()
    heads, kv_heads, blocks = _model_shape(model)
    rejected: Counter = Counter()
    scorer = _Scorer(model, hardware, global_batch=global_batch, seq=seq, precision=precision,
                     optimizer=optimizer, score_fn=score_fn, software=software)
    capacity = float(hardware.memory_bytes)
    skeletons = skeleton_rows(world_size, global_batch, heads=heads, kv_heads=kv_heads, blocks=blocks, space=space,
                              rejected=rejected)
    if len(skeletons["dp"]) == 0:
        raise ConfigError("gpus", world_size, _no_space_reason(world_size, global_batch, heads, blocks, rejected))
    lean1 = leanest(skeletons, space=space)
    _, _, peak1_all, _ = scorer(lean1)
    bound_evals, pruned = len(peak1_all), 0
    peak1 = leanest_peak(peak1_all, skeletons, space=space)
    levels_n = len(space.recompute)
    best_level = np.argmin(peak1_all.reshape(-1, levels_n), axis=1)
    lean1 = {k: v.reshape(-1, levels_n)[np.arange(len(peak1)), best_level] for k, v in lean1.items()}
    keep1 = peak1 <= capacity if prune else np.ones(len(peak1), bool)
    rows = with_micro_batches(_take(skeletons, keep1), global_batch, space=space, rejected=rejected)
    if prune and (~keep1).any():
        dropped = with_micro_batches(_take(skeletons, ~keep1), global_batch, space=space)
        pruned += int(free_knob_count(dropped, space=space).sum())
    if prune and len(rows["dp"]):
        _, _, peak2, _ = scorer(leanest(rows, space=space))
        bound_evals += len(peak2)
        keep2 = leanest_peak(peak2, rows, space=space) <= capacity
        pruned += int(free_knob_count(_take(rows, ~keep2), space=space).sum())
        rows = _take(rows, keep2)
    # Time bound (module docstring): first every (row, placement) with the weakest recompute and
    # sequence parallelism on where tp > 1 -- the least compute of its group -- then the rest of the
    # group only where that compute is below the admission threshold.
    weakest = min(RECOMPUTE.index(r) for r in space.recompute)
    sp_first = True in space.sequence_parallel
    firsts = with_free_knobs(rows, space=replace(space, recompute=(RECOMPUTE[weakest],),
                                                 sequence_parallel=(sp_first,)))
    total = int(free_knob_count(rows, space=space).sum())
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], total)

    step0, peak0, need0, compute0 = scorer(firsts, tick) if len(firsts["dp"]) else (np.zeros(0),) * 4
    keep_groups = np.ones(len(step0), bool)
    if time_bound:
        keep_groups = compute0 < _admission_threshold(step0, need0, capacity, objective, keep)
    rest = _rest_of_groups(_take(firsts, keep_groups), space=space, weakest=weakest, sp_first=sp_first)
    step1, peak1_, need1, _ = scorer(rest, tick) if len(rest["dp"]) else (np.zeros(0),) * 4
    parts, steps, peaks = [firsts, rest], [step0, step1], [peak0, peak1_]
    full = {k: np.concatenate([p[k] for p in parts]) for k in FIELDS}
    step, peak, needed = np.concatenate(steps), np.concatenate(peaks), np.concatenate([need0, need1])
    scored_n = len(step)
    skipped = total - scored_n
    assert skipped >= 0
    stats = SearchStats(candidates_evaluated=scored_n, feasible=int((needed <= capacity).sum()),
                        seconds=time.perf_counter() - t0, space=total + pruned, pruned_by_memory_bound=pruned,
                        pruned_by_time_bound=skipped, bound_evaluations=bound_evals, rejected=dict(rejected))
    return ScoredSpace(arrays=full, step_time_s=step, peak_bytes_per_gpu=peak, needed_bytes=needed,
                       capacity_bytes=capacity, leanest_arrays=lean1, leanest_needed_bytes=peak1, stats=stats)


def _no_space_reason(world, global_batch, heads, blocks, rejected) -> str:
    reasons = "; ".join(f"{k}: {v}" for k, v in sorted(rejected.items()))
    return (f"a world size with at least one valid (dp, tp, pp): tp | heads({heads}), pp <= blocks({blocks}), "
            f"dp | global_batch({global_batch}); all degree triples of {world} were rejected ({reasons})")


def rank(scored: ScoredSpace, objective: str) -> np.ndarray:
    """Indices of the feasible candidates, best first, for the objective (ties: less memory first)."""
    if objective not in OBJECTIVES:
        raise ConfigError("objective", objective, "one of " + ", ".join(OBJECTIVES))
    idx = np.flatnonzero(scored.fits & np.isfinite(scored.step_time_s))    # an infinite step is never ranked
    step, peak = scored.step_time_s[idx], scored.peak_bytes_per_gpu[idx]
    if objective == "memory" and len(idx):
        near = step <= step.min() * (1 + MEMORY_OBJECTIVE_SLACK)
        idx, step, peak = idx[near], step[near], peak[near]
        return idx[np.lexsort((step, peak))]
    return idx[np.lexsort((peak, step))]


# ----------------------------------------------------------------------------------------- no fit

def no_fit_error(scored: ScoredSpace, *, model, hardware, world_size: int, global_batch: int, seq: int,
                 precision: str, optimizer: str, space: SearchSpace, framework: str = "megatron") -> NoFitError:
    """How far the leanest candidate misses and what would make one fit (exit 3)."""
    i = int(np.argmin(scored.leanest_needed_bytes))
    need = float(scored.leanest_needed_bytes[i])
    cap = scored.capacity_bytes
    cfg = config_of(scored.leanest_arrays, i, global_batch=global_batch, seq=seq, precision=precision,
                    optimizer=optimizer, framework=framework)
    per_node = hardware.devices_per_node
    more = math.ceil(world_size * need / cap / per_node) * per_node
    fixes = [f"more GPUs (about {more}, {more // per_node} nodes: static memory shrinks roughly as 1/GPUs)"]
    untried = []
    if 3 not in space.zero:
        untried.append("ZeRO-3")
    if "full" not in space.recompute:
        untried.append("full recompute")
    if "optimizer" not in space.offload:
        untried.append("optimizer offload")
    if untried:
        fixes.append("allow " + ", ".join(untried) + f" (not available on {framework}: try another --framework)")
    bigger = _larger_devices(hardware, need)
    if bigger:
        fixes.append("a larger device (" + ", ".join(bigger) + ")")
    fixes.append("a shorter --seq")
    tried = (f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} micro_batch=1 zero={cfg.zero} recompute={cfg.recompute} "
             f"offload={cfg.offload}, the least memory over every ZeRO stage, recompute and offload searched")
    return NoFitError(
        f"no plan fits in {cap / 2**30:.1f} GiB per GPU on {world_size} x {hardware.name}: the leanest candidate "
        f"({tried}) needs {need / 2**30:.1f} GiB, {(need - cap) / 2**30:.1f} GiB ({need / cap - 1:.0%}) too much; "
        f"it would fit with " + "; or ".join(fixes))


def non_finite_error(scored: ScoredSpace, hardware) -> ConfigError:
    """Candidates fit but none has a finite step time: the profile makes some term impossible."""
    n = int(np.sum(scored.fits & ~np.isfinite(scored.step_time_s)))
    return ConfigError("hardware", hardware.name, "a profile with positive efficiencies and bandwidths",
                       message=f"hardware={hardware.name!r}: every candidate that fits ({n:,}) has an infinite or "
                               f"undefined step time; a zero efficiency, rate or bandwidth in the profile makes "
                               f"some term impossible")


def _larger_devices(hardware, need_bytes: float) -> list[str]:
    try:
        from hardware_profiles import available_profiles, load_profile
        names = available_profiles()
    except Exception:  # noqa: BLE001 - suggestions only; the error itself must still be raised
        return []
    out = []
    for name in names:
        try:
            profile = load_profile(name)
        except Exception:  # noqa: BLE001
            continue
        if profile.memory_bytes >= need_bytes and profile.name != hardware.name:
            out.append(f"{profile.name} {profile.memory_bytes / 2**30:.0f} GiB")
    return out


# ------------------------------------------------------------------------------------- refinement

def stage_problem(model, cfg: ParallelConfig, software=None):
    """Per-block work and memory weights of one micro-batch on one tensor-parallel rank, for
    planner.partition: block FLOPs (forward + backward + recompute) from cost_models.flops, weights
    from cost_models.params, activations from cost_models.activations (the block tables the cost
    model reads) and model states from the framework's table (cost_models.memory.state_bytes_per_param,
    sharded as the plan's ZeRO stage shards them). The embedding is on stage 0; final norm, LM head
    and loss on the last stage. Static bytes only break ties between equally fast splits; whether a
    split fits is decided by estimate() afterwards."""
    from cost_models import activations as A
    from cost_models import flops as F
    from cost_models import params as P
    from cost_models.memory import state_bytes_per_param
    from planner.estimate import software_for
    from planner.partition import PartitionProblem

    sw = software or software_for(cfg.framework)
    b, s, tp = cfg.micro_batch, cfg.seq, cfg.tp
    blocks = model.total_blocks
    block_work = (F.block_flops_fwd(model, b, s) + F.block_flops_bwd(model, b, s)
                  + F.block_recompute_flops(model, b, s, cfg.recompute, selective=sw.framework.selective_recompute)) / tp
    head_work = 3 * F.head_flops_fwd(model, b, s) / tp
    pb, gb, ob = state_bytes_per_param(sw, cfg.precision, cfg.optimizer)
    dp = cfg.shard_group
    shard = (pb / (dp if cfg.zero >= 3 else 1)) + (gb / (dp if cfg.zero >= 2 else 1)) + (ob / (dp if cfg.zero >= 1 else 1))
    block_static = P.block_params(model) / tp * shard
    from cost_models.step import activation_precision
    act = dict(precision=activation_precision(sw, cfg.precision, cfg.zero), tp=tp, sp=cfg.sequence_parallel)
    block_act = A.block_bytes(model, b, s, kernels=sw.framework.kernels, flash=sw.kernel(cfg.precision, model) != "math", dropout=sw.dropout,
                              recompute=cfg.recompute, selective=sw.framework.selective_recompute, **act)
    # with pp > 1 a tied output head is a second copy on the last stage, summed with the embedding's
    # gradient once per step (Megatron's embedding group; Shoeybi et al. 2019)
    tied_copy = model.vocab * model.hidden if model.tied_embeddings else 0
    chunks = cfg.pp * cfg.virtual_stages
    inflight = tuple(max(1, cfg.pp - (c % cfg.pp)) if cfg.schedule != "gpipe" else cfg.num_microbatches
                     for c in range(chunks))
    return PartitionProblem(
        block_work=(float(block_work),) * blocks, block_static_bytes=(float(block_static),) * blocks,
        block_activation_bytes=(float(block_act),) * blocks, pp=cfg.pp, virtual_stages=cfg.virtual_stages,
        first_work=0.0, first_static_bytes=P.embedding_params(model) / tp * shard,
        first_activation_bytes=float(A.embedding_bytes(model, b, s, dropout=sw.dropout, **act)),
        last_work=float(head_work),
        last_static_bytes=(P.head_params(model) + P.final_norm_params(model) + tied_copy) / tp * shard,
        last_activation_bytes=float(A.head_bytes(model, b, s, kernels=sw.framework.kernels, **act)),
        inflight=inflight)


def uneven_stages(model, cfg: ParallelConfig) -> tuple[int, ...]:
    """The fastest contiguous split of the blocks for cfg (empty when pp = 1 or the model has no blocks)."""
    from planner.partition import even_split, split

    if cfg.pp == 1 or not hasattr(model, "total_blocks"):
        return ()
    if cfg.virtual_stages > 1 and cfg.pp * cfg.virtual_stages > CPSAT_MAX_CHUNKS:
        return ()
    try:
        part = split(stage_problem(model, cfg), time_limit_s=CPSAT_TIME_LIMIT_S)
    except ConfigError:       # no split within the limits: keep the even one
        return ()
    return () if part.stages == even_split(model.total_blocks, cfg.pp * cfg.virtual_stages) else part.stages


# -------------------------------------------------------------------------------------- documents

def _with_cost(document: dict, price_per_hour: float | None, spot: bool, tokens: float | None,
               hardware=None, reliability=None) -> dict:
    """Dollars per step and per 1B tokens; with `tokens`, the time and cost to train including failures,
    checkpoints and restarts (planner.goodput) beside the failure-free figures."""
    pred = document["prediction"]
    step = pred["step_time_s"]
    tokens_per_step = document["plan"]["global_batch"] * document["plan"]["seq"]
    if price_per_hour is not None:
        usd_step = price_per_hour * step / 3600.0
        pred["cost"] = {"usd_per_hour": price_per_hour, "usd_per_step": usd_step,
                        "usd_per_1b_tokens": usd_step / tokens_per_step * 1e9, "spot": spot}
    if tokens:
        train = {"tokens": tokens, "steps": math.ceil(tokens / tokens_per_step)}
        train["seconds"] = train["steps"] * step
        train["days"] = train["seconds"] / 86400.0
        if price_per_hour is not None:
            train["usd"] = price_per_hour * train["seconds"] / 3600.0
        if hardware is not None:
            from planner.goodput import reliability_figures, with_reliability
            figures = reliability_figures(document, hardware, tokens=tokens, price_per_hour=price_per_hour,
                                          inputs=reliability, spot=spot)
            with_reliability(document, figures)
            train = {"tokens": tokens, "steps": train["steps"], "seconds": figures["time_to_train_s"],
                     "days": figures["time_to_train_s"] / 86400.0, "seconds_without_failures": train["seconds"],
                     "days_without_failures": train["days"]}
            if price_per_hour is not None:
                train |= {"usd": figures["usd"], "usd_without_failures": figures["usd_without_failures"]}
        pred["to_train"] = train
    return document


def key_numbers(document: Mapping[str, Any]) -> dict:
    """What `explain` needs of a runner-up: its plan and the deciding numbers."""
    pred = document["prediction"]
    return {"plan": dict(document["plan"]), "step_time_s": pred["step_time_s"],
            "peak_bytes_per_gpu": int(pred["memory"]["peak_bytes_per_gpu"]), "fits": bool(pred["memory"]["fits"]),
            "mfu": pred.get("mfu"), "time_breakdown_s": dict(pred["time_breakdown_s"]),
            "memory": dict(pred["memory"])}


def _objective_value(document: Mapping[str, Any], objective: str) -> tuple:
    pred = document["prediction"]
    peak = pred["memory"]["peak_bytes_per_gpu"]
    if objective == "memory":
        return (peak, pred["step_time_s"])
    if objective in ("time-to-train", "cost") and "reliability" in pred:
        return (pred["reliability"]["time_to_train_s"], pred["step_time_s"], peak)
    return (pred["step_time_s"], peak)


def _reliability_inputs(inputs, *, objective: str, tokens: float | None, spot: bool):
    """The goodput inputs, validated before the search (one ConfigError naming the flag)."""
    from planner.goodput import ReliabilityInputs

    inputs = ReliabilityInputs() if inputs is None else inputs
    if objective == "time-to-train" and not tokens:
        raise ConfigError("tokens", tokens, "a training length with --objective time-to-train",
                          message="--objective time-to-train needs --tokens N (the length of the run, e.g. 300B)")
    if inputs.given and not tokens:
        flag = inputs.given[0]
        raise ConfigError(flag.lstrip("-"), getattr(inputs, flag.lstrip("-").replace("-", "_")), "--tokens N as well",
                          message=f"{flag} needs --tokens N: goodput is computed for a run of N tokens")
    if inputs.spot_interruptions_per_node_hour is not None and not spot:
        raise ConfigError("spot-interruptions-per-node-hour", inputs.spot_interruptions_per_node_hour,
                          "only with --spot (on-demand nodes are not reclaimed)")
    if spot and objective == "time-to-train" and inputs.spot_interruptions_per_node_hour is None:
        raise ConfigError("spot-interruptions-per-node-hour", None, "your spot reclaim rate per node-hour with --spot "
                          "--objective time-to-train (it varies by instance type, zone and hour; no default)",
                          message="--spot with --objective time-to-train needs --spot-interruptions-per-node-hour "
                                  "RATE (reclaims per node-hour; it varies by instance type, zone and hour, so the "
                                  "planner has no default)")
    return inputs.validated()


# ----------------------------------------------------------------------------------------- recommend

def recommend(model, hardware, *, gpus: int | None = None, nodes: int | None = None,
              global_batch: int | None = None, seq: int | None = None, precision: str | None = None,
              optimizer: str = "adamw", objective: str = "throughput", top: int = 5, spot: bool = False,
              price_per_hour: float | None = None,
              tokens: float | None = None, space: SearchSpace = SearchSpace(), refine: int = REFINE_TOP,
              progress: Callable[[int, int], None] | None = None, score_fn=None, estimate_fn=None,
              framework: str = "megatron", attention: str | None = None, dropout: bool | None = None,
              overlap_grad_reduce: bool | None = None, grad_reduce_dtype: str | None = None, reliability=None) -> Recommendation:
    """Search the parallel strategies of `model` on `gpus` devices of `hardware` and rank them.

    `model` is a MODEL argument (catalog name, config.json, factory) or a resolved spec; `hardware`
    a profile name, path or HardwareProfile; `framework` the software stack (frameworks/*.json): only
    plans it can run are searched (SearchSpace.for_framework), costed with its profile. `attention`,
    `dropout`, `overlap_grad_reduce` override the framework's defaults for score() and estimate().
    With `tokens`, every plan document carries its goodput under failures (planner.goodput) from
    `reliability` (planner.goodput.ReliabilityInputs: the user's failure rates, restart time, storage,
    save mode, spot reclaim rate; None: the sourced defaults); objective "time-to-train" needs `tokens`.
    Raises ConfigError for bad input, NoFitError when no candidate fits in memory.
    """
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ConfigError("objective", objective, "one of " + ", ".join(OBJECTIVES))
    if top < 1:
        raise ConfigError("top", top, "a positive integer")
    reliability = _reliability_inputs(reliability, objective=objective, tokens=tokens, spot=spot)
    model, hardware, world, n_nodes = _resolve(model, hardware, gpus, nodes, seq)
    from planner.estimate import software_for

    software = software_for(framework, attention=attention, dropout=dropout, overlap_grad_reduce=overlap_grad_reduce,
                            grad_reduce_dtype=grad_reduce_dtype)
    precision = resolve_precision(hardware, precision)    # None: bf16 mixed precision where the device has bf16
    ParallelConfig(precision=precision, optimizer=optimizer, framework=software.framework.name)  # validates them
    from frameworks.rules import violations
    problems = violations(software.framework, ParallelConfig(precision=precision, framework=software.framework.name))
    if problems:
        raise ConfigError("precision", precision, f"a precision {software.framework.name} runs",
                          message=f"framework {software.framework.name} cannot run this plan: {problems[0]}")
    space = space.for_framework(software.framework)
    seq = seq or model.seq
    global_batch = global_batch or default_global_batch(world, seq)
    price = _price_per_hour(hardware, n_nodes, spot, price_per_hour)
    if estimate_fn is None:
        from planner.estimate import estimate as estimate_fn

    scored = score_space(model, hardware, world_size=world, global_batch=global_batch, seq=seq,
                         precision=precision, optimizer=optimizer, space=space, score_fn=score_fn,
                         objective=objective, keep=max(top, refine) + 1, software=software,
                         progress=progress)
    order = rank(scored, objective)
    if len(order) == 0 and np.any(scored.fits):
        raise non_finite_error(scored, hardware)
    if len(order) == 0:
        raise no_fit_error(scored, model=model, hardware=hardware, world_size=world, global_batch=global_batch,
                           seq=seq, precision=precision, optimizer=optimizer, space=space,
                           framework=software.framework.name)

    kw = dict(global_batch=global_batch, seq=seq, precision=precision, optimizer=optimizer,
              framework=software.framework.name)
    opts = {k: v for k, v in dict(attention=attention, dropout=dropout, overlap_grad_reduce=overlap_grad_reduce,
                                  grad_reduce_dtype=grad_reduce_dtype).items() if v is not None}
    leaders = [config_of(scored.arrays, int(i), **kw) for i in order[:max(top, refine) + 1]]
    documents, refined = [], 0
    for position, cfg in enumerate(leaders):
        doc = estimate_fn(model, hardware, cfg, gpus=world, **opts).to_document()
        if position < refine and cfg.pp > 1:
            stages = uneven_stages(model, cfg)
            if stages:
                refined += 1
                uneven = estimate_fn(model, hardware, replace(cfg, stages=stages), gpus=world, **opts).to_document()
                if uneven["prediction"]["memory"]["fits"] and \
                        _objective_value(uneven, objective) < _objective_value(doc, objective):
                    doc = uneven
        documents.append(doc)
    documents = [d for d in documents if d["prediction"]["memory"]["fits"]] or documents
    documents = [_with_cost(d, price, spot, tokens, hardware, reliability) for d in documents]
    documents.sort(key=lambda d: _objective_value(d, objective))
    documents = documents[:top]

    stats = replace(scored.stats, seconds=time.perf_counter() - t0, refined=refined)
    best = dict(documents[0])
    best["alternatives"] = [key_numbers(d) for d in documents[1:]]
    best["search"] = {"objective": objective, "candidates_evaluated": stats.candidates_evaluated,
                      "feasible": stats.feasible, "seconds": round(stats.seconds, 4)}
    return Recommendation(objective=objective, best=best, alternatives=tuple(documents[1:]), stats=stats,
                          scored=scored)
