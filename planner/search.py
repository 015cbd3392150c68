"""Strategy search: every valid candidate scored by the vectorized cost model or proven out by a bound.

Pipeline (docs/style.md's one-way flow): candidates (planner.candidates: dp x tp x pp x cp with cp_comm,
dp_shard, ep, schedule, ZeRO, offload, micro-batch, recompute, sequence parallelism, placement) ->
best-first branch and bound over "shapes" with time and memory lower bounds -> vectorized scores
(planner.score.score, numpy over arrays) -> ranking by the objective -> uneven stages for the leaders
(planner.partition) re-scored with the scalar `estimate()` -> plan documents.

Bounds (`_BranchAndBound`; the premises are checked on the real scorer in tests/test_search.py). A row is a
skeleton (SKELETON_FIELDS) with a micro-batch; a group is a row with a placement and a sequence-parallel
choice, whose members are the recompute levels; a shape is a group without its model-state knobs (ZeRO
stage, dp_shard, offload) and with placements that lay T and C on the same ranks merged
(`placement_classes`). The step is never shorter than compute + tp, cp comm + bubble + pipeline p2p +
optimizer (TIME_BOUND_TERMS); within a group that sum is least at the weakest recompute and grows along
RECOMPUTE; all of it but the optimizer step (SHAPE_BOUND_TERMS) is the same for every candidate of a shape
and never less with sequence parallelism off. So one scorer call -- each shape's representative at the
weakest recompute with sequence parallelism on -- bounds every candidate of every shape. Shapes are expanded
best first while their bound is below the admission threshold (the `keep`-th best feasible step known for
throughput, cost and time-to-train, the best plus 5 % for memory; it only falls as candidates are
scored); a group's first is scored only if its shape's terms plus its pipeline p2p (read off the shape's
representative row with the same placement and sequence parallelism) and its skeleton's optimizer step
(scored once per skeleton) are below it, each stronger recompute level only if the previous level's bound is, and a
member with sequence parallelism off is dropped when its twin with it on (which never needs more memory)
does not fit. The best plan with cp = 1 and the best with cp > 1 are each found exactly (the threshold of
each class never falls below its best known step), so that `explain` can say why the chosen cp wins.

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

from cost_models.params import total_params
from planner.candidates import (
    FIELDS,
    SearchSpace,
    _pattern_groups,
    _product,
    config_of_row,
    leanest,
    skeleton_rows,
    with_micro_batches,
)
from planner.errors import ConfigError, NoFitError
from planner.parallel import (
    CP_COMMS,
    OFFLOAD,
    RECOMPUTE,
    SCHEDULES,
    ParallelConfig,
    default_placement,
    offload_indices,
    offloads,
)
from cost_models.compute import resolve_precision
from planner.placement import PLACEMENTS, packed_key
import planner.estimate as estimate_module  # its STEP_MODEL is read at call time
from planner.option_rules import check_options
from planner.uncertainty import ties_of, with_bands
from planner.run_options import RunOptions
from planner.software import (
    check_activation_fp8_input,
    check_master_weights,
    check_moe_options,
    software_for,
)
from planner.spec import TransformerSpec

OBJECTIVES = ("throughput", "cost", "memory", "time-to-train")
MEMORY_OBJECTIVE_SLACK = 0.05
"""The memory objective accepts candidates up to 5 % slower than the fastest."""
DEFAULT_BATCH_TOKENS = 2**21
"""Default global batch, in tokens: about 2M, inside GPT-3's 0.5M-3.2M range (Brown et al. 2020,
Table 2.1) and Llama 2's 4M (Touvron et al. 2023); rounded up to a multiple of the world size."""
SCORE_CHUNK = 16_384
"""Candidates scored per call (one progress tick each). Small enough that the scorer's temporary arrays
(128 KiB of float64 each) stay in the CPU caches and are reused from the allocator's heap: with 262,144 the
2 MiB temporaries were fresh pages each call (page faults: ~0.3 s of system time of a 1.8 s DeepSeek-V3
search on 2,048 GPUs); the per-call overhead of score() is small beside that. Rows are scored independently,
so the chunk never changes a score."""
CPSAT_MAX_CHUNKS = 16
"""Interleaved candidates with more chunks than this keep the even split (CP-SAT grows slow there)."""
CPSAT_TIME_LIMIT_S = 1.0
REFINE_TOP = 8
"""Leading candidates whose pipeline stages are re-split unevenly and re-scored with estimate()."""
TIME_BOUND_TERMS = ("compute", "tp_comm", "cp_comm", "bubble_bound", "pp_p2p_bound", "optimizer")
"""Step-time terms of planner.score that are least, within a group, for the weakest recompute with
sequence parallelism on, and whose sum never exceeds the step (checked in tests/test_search.py) nor
the simulated step that estimate() documents the leaders with (cost_models.timeline;
tests/test_timeline.py): the pipeline's idle time and sends enter as the lower bounds both steps
share (Scores.bubble_bound, Scores.pp_p2p_bound), not as the closed form's. Exposed data-parallel
and offload time are left out: more recompute can hide them."""
SHAPE_BOUND_TERMS = ("compute", "tp_comm", "cp_comm", "bubble_bound")
"""The TIME_BOUND_TERMS that do not depend on the model-state knobs (ZeRO stage, dp_shard, offload): one
evaluation bounds every candidate of a shape (checked in tests/test_search.py)."""
SHAPE_FIELDS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "cp_comm",
    "ep",
    "schedule",
    "virtual_stages",
    "micro_batch",
)
"""The knobs of a shape: a candidate without its model-state knobs, recompute, sequence parallelism and
placement (the placement is added to make a shape: it moves the communication terms)."""


TINY_MODEL_PARAMS = 10_000_000
"""Below this many parameters (no catalog model: GPT-2's 124M is the smallest) a model is a test or
demo model
(planner.executor.tiny), and the default batch is TINY_SEQUENCES_PER_RANK sequences per rank, not
~2M tokens."""
TINY_SEQUENCES_PER_RANK = 4


def default_global_batch(world_size: int, seq: int, params: int | None = None) -> int:
    """About DEFAULT_BATCH_TOKENS tokens, as a multiple of the world size (so every dp divides it);
    for a model of
    fewer than TINY_MODEL_PARAMS parameters, TINY_SEQUENCES_PER_RANK sequences per rank.

    >>> default_global_batch(960, 2048)
    1920
    >>> default_global_batch(8, 4096)
    512
    >>> default_global_batch(4, 32, params=70_000)
    16
    """
    if params is not None and params < TINY_MODEL_PARAMS:
        return world_size * TINY_SEQUENCES_PER_RANK
    sequences = max(1, DEFAULT_BATCH_TOKENS // seq)
    return world_size * math.ceil(sequences / world_size)


def model_params(model) -> int | None:
    """Parameters of a TransformerSpec or a measured ModuleSpec (None for anything else)."""
    if isinstance(model, TransformerSpec):
        return total_params(model)
    params = getattr(model, "params", None)
    return params if isinstance(params, int) else None


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
    values_tried: Mapping[str, list] = field(default_factory=dict)
    """Distinct cp, cp_comm, dp_shard and ep values the rules admitted (search.values_tried)."""
    held: Mapping[str, str] = field(default_factory=dict)
    """Dimensions the framework holds at 1 for this model, each with why (search.held_dimensions)."""

    def to_dict(self) -> dict:
        return {
            "candidates_evaluated": self.candidates_evaluated,
            "feasible": self.feasible,
            "seconds": round(self.seconds, 4),
            "space": self.space,
            "pruned_by_memory_bound": self.pruned_by_memory_bound,
            "pruned_by_time_bound": self.pruned_by_time_bound,
            "bound_evaluations": self.bound_evaluations,
            "refined": self.refined,
            "rejected": dict(self.rejected),
            "values_tried": {k: list(v) for k, v in self.values_tried.items()},
            **({"held": dict(self.held)} if self.held else {}),
        }


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
        return {
            "schema_version": self.best["schema_version"],
            "model": self.best["model"],
            "hardware": self.best["hardware"],
            "objective": self.objective,
            "search": self.stats.to_dict(),
            "best": dict(self.best),
            "alternatives": [dict(a) for a in self.alternatives],
        }

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

        model = transformer_spec(model)  # a factory's module that describes its transformer
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
        raise ConfigError(
            "gpus",
            gpus,
            f"nodes({nodes})*devices_per_node({per_node})={nodes * per_node}, or give one of them",
        )
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


def _price_per_hour(
    hardware, nodes: int, spot: bool, node_price: float | None = None
) -> float | None:
    """Dollars per hour for `nodes` nodes: `node_price` (the user's own price: negotiated, reserved or
    today's spot) when given, else the profile's on-demand or spot price."""
    if node_price is not None:
        if not (
            isinstance(node_price, (int, float)) and math.isfinite(node_price) and node_price > 0
        ):
            raise ConfigError(
                "price-per-hour", node_price, "a positive number of US dollars per node-hour"
            )
        return float(node_price) * nodes
    price = hardware.spot_price_usd_per_hour if spot else hardware.price_usd_per_hour
    if spot and price is None:
        raise ConfigError(
            "spot",
            True,
            f"a spot price: {hardware.name}'s profile has none (spot prices move "
            "daily); pass today's with --price-per-hour USD (per node)",
        )
    return None if price is None else price * nodes


# -------------------------------------------------------------------------------------------- scoring


@dataclass(frozen=True, slots=True)
class _Scores:
    """What the search reads of planner.score.Scores for a batch of candidates."""

    step: np.ndarray
    peak: np.ndarray
    needed: np.ndarray
    """What decides fitting (Scores.needed_bytes: the peak with the allocator's overhead and the CUDA
    context; the peak itself where a scorer handed in by a test reports no more)."""
    terms: Mapping[str, np.ndarray]
    """Each of TIME_BOUND_TERMS (zeros where the scorer reports no such term)."""

    @property
    def bound(self) -> np.ndarray:
        """Sum of TIME_BOUND_TERMS: no step is shorter, and a group's first has the least."""
        return sum(self.terms[t] for t in TIME_BOUND_TERMS)

    @property
    def shape_bound(self) -> np.ndarray:
        """Sum of SHAPE_BOUND_TERMS: the same for every candidate of a shape at the weakest recompute."""
        return sum(self.terms[t] for t in SHAPE_BOUND_TERMS)

    @classmethod
    def empty(cls) -> "_Scores":
        return cls(
            np.zeros(0), np.zeros(0), np.zeros(0), {t: np.zeros(0) for t in TIME_BOUND_TERMS}
        )


class _Scorer:
    """Calls planner.score.score on dicts of candidate arrays, in chunks, counting what it scored."""

    def __init__(
        self,
        model,
        hardware,
        *,
        global_batch,
        seq,
        precision,
        optimizer,
        score_fn=None,
        software=None,
    ):
        if score_fn is None:
            from planner.score import score as score_fn
        self.score_fn = score_fn
        self.kw = dict(global_batch=global_batch, seq=seq, precision=precision, optimizer=optimizer)
        if software is not None:
            self.kw["software"] = software
        self.model, self.hardware = model, hardware

    def __call__(
        self, arrays: Mapping[str, np.ndarray], progress: Callable[[int], None] | None = None
    ) -> _Scores:
        """The scores of every candidate in `arrays` (see _Scores), in chunks of SCORE_CHUNK."""
        n = len(arrays["dp"])
        step, peak, needed = np.empty(n), np.empty(n), np.empty(n)
        terms = {t: np.zeros(n) for t in TIME_BOUND_TERMS}
        for start in range(0, n, SCORE_CHUNK):
            chunk = {k: v[start : start + SCORE_CHUNK] for k, v in arrays.items()}
            scores = self.score_fn(self.model, self.hardware, _candidate_arrays(chunk), **self.kw)
            part = slice(start, start + SCORE_CHUNK)
            step[part] = np.asarray(scores.step_time_s, dtype=float)
            peak[part] = np.asarray(scores.peak_bytes_per_gpu, dtype=float)
            needed[part] = np.asarray(
                getattr(scores, "needed_bytes", scores.peak_bytes_per_gpu), dtype=float
            )
            for term in TIME_BOUND_TERMS:
                if hasattr(scores, term):
                    terms[term][part] = np.asarray(getattr(scores, term), dtype=float)
            if progress is not None:
                progress(len(chunk["dp"]))
        return _Scores(step, peak, needed, terms)


def _admission_threshold(
    step: np.ndarray, needed: np.ndarray, capacity: float, objective: str, keep: int
) -> float:
    """Step time above which a candidate cannot enter the result (see the module docstring)."""
    feasible = step[needed <= capacity]
    if objective == "memory":
        return feasible.min() * (1 + MEMORY_OBJECTIVE_SLACK) if len(feasible) else np.inf
    # the keep-th smallest (np.partition: linear time; the search asks ~30 times over ~10^5 known steps)
    return np.partition(feasible, keep - 1)[keep - 1] if len(feasible) >= keep else np.inf


def _candidate_arrays(arrays: Mapping[str, np.ndarray]):
    from planner.score import CandidateArrays

    return CandidateArrays(**{k: np.asarray(arrays[k]) for k in FIELDS})


def _take(rows: Mapping[str, np.ndarray], mask) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in rows.items()}


def config_of(
    arrays: Mapping[str, np.ndarray],
    i: int,
    *,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str,
    stages: tuple[int, ...] = (),
    framework: str = "megatron",
) -> ParallelConfig:
    """Row i of candidate arrays as a ParallelConfig (planner.candidates.config_of_row)."""
    return config_of_row(
        arrays,
        i,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        stages=stages,
        framework=framework,
    )


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
    unscored_at_least_s: tuple[float, float] = (math.inf, math.inf)
    """The admission thresholds (cp = 1, cp > 1) when the search ended: every candidate of the class that fits
    and was not scored was proven to take at least this long (thresholds only fall while the search runs)."""

    @property
    def fits(self) -> np.ndarray:
        """The cost model's one "fits" (cost_models.memory.fits): needed <= capacity."""
        return self.needed_bytes <= self.capacity_bytes

    def to_pandas(self):
        """One row per scored candidate (index: its position in `arrays`, so `config_of(arrays, i, ...)`
        rebuilds it): the knobs, with schedule, recompute, offload and cp_comm as their names and the
        placement as the plan writes it (C and E in place when cp, ep > 1), then step_time_s,
        peak_bytes_per_gpu and fits. For notebooks:
        `planner.recommend("gpt2", "p4d.24xlarge", gpus=8).to_pandas().query("fits")`."""
        import pandas as pd

        from planner.candidates import placement_text

        names = {
            "schedule": SCHEDULES,
            "recompute": RECOMPUTE,
            "offload": OFFLOAD,
            "cp_comm": CP_COMMS,
        }
        columns = {}
        for key, values in self.arrays.items():
            values = np.asarray(values)
            columns[key] = np.asarray(names[key], dtype=object)[values] if key in names else values
        if "placement" in self.arrays:
            n = len(self.arrays["placement"])
            with_c = np.asarray(self.arrays.get("cp", np.ones(n, int))) > 1
            with_e = np.asarray(self.arrays.get("ep", np.ones(n, int))) > 1
            table = np.array(
                [
                    [[placement_text(i, cp=1 + c, ep=1 + e) for e in (0, 1)] for c in (0, 1)]
                    for i in range(len(PLACEMENTS))
                ],
                dtype=object,
            )
            columns["placement"] = table[
                np.asarray(self.arrays["placement"]), with_c.astype(int), with_e.astype(int)
            ]
        columns["step_time_s"] = np.asarray(self.step_time_s, dtype=float)
        peak = np.asarray(self.peak_bytes_per_gpu, dtype=float)
        columns["peak_bytes_per_gpu"] = (
            peak.round().astype(np.int64) if np.all(np.isfinite(peak)) else peak
        )
        columns["fits"] = np.asarray(self.fits, dtype=bool)
        return pd.DataFrame(columns)


def score_space(
    model,
    hardware,
    *,
    world_size: int,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str,
    space: SearchSpace = SearchSpace(),
    score_fn=None,
    prune: bool = True,
    objective: str = "throughput",
    keep: int = 10,
    time_bound: bool = True,
    software=None,
    progress: Callable[[int, int], None] | None = None,
) -> ScoredSpace:
    """Generate, bound and score the whole space (module docstring); no ranking yet."""
    t0 = time.perf_counter()
    heads, kv_heads, blocks = _model_shape(model)
    rejected: Counter = Counter()
    scorer = _Scorer(
        model,
        hardware,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        score_fn=score_fn,
        software=software,
    )
    capacity = float(hardware.memory_bytes)
    moe = getattr(model, "moe", None)
    skeletons = skeleton_rows(
        world_size,
        global_batch,
        heads=heads,
        kv_heads=kv_heads,
        blocks=blocks,
        space=space,
        rejected=rejected,
        seq=seq,
        experts=moe.experts if moe is not None else None,
        fast_domain=getattr(hardware, "nvlink_domain_devices", None),
    )
    tried = values_tried(skeletons)
    skeletons = _costed(skeletons, rejected)
    if len(skeletons["dp"]) == 0:
        raise ConfigError(
            "gpus", world_size, _no_space_reason(world_size, global_batch, heads, blocks, rejected)
        )
    skeletons["skeleton"] = np.arange(len(skeletons["dp"]))
    search = _BranchAndBound(
        with_micro_batches(skeletons, global_batch, space=space, rejected=rejected),
        space=space,
        scorer=scorer,
        capacity=capacity,
        objective=objective,
        keep=keep,
        prune=prune,
        time_bound=time_bound,
        progress=progress,
    )
    search.run()  # (the unsorted rows are freed before it: the scorer's arrays reuse their memory)
    full, step, peak, needed = search.result()
    nothing_fits = not np.any(needed <= capacity)
    lean1, lean1_needed = (
        _skeleton_bounds(skeletons, scorer, space) if nothing_fits else ({}, np.zeros(0))
    )
    stats = SearchStats(
        candidates_evaluated=len(step),
        feasible=int((needed <= capacity).sum()),
        seconds=time.perf_counter() - t0,
        space=search.total,
        pruned_by_memory_bound=search.pruned_memory,
        pruned_by_time_bound=search.pruned_time,
        bound_evaluations=search.bound_evaluations,
        rejected=dict(rejected),
        values_tried=tried,
    )
    assert (
        stats.space
        == stats.candidates_evaluated + stats.pruned_by_memory_bound + stats.pruned_by_time_bound
    )
    return ScoredSpace(
        arrays=full,
        step_time_s=step,
        peak_bytes_per_gpu=peak,
        needed_bytes=needed,
        capacity_bytes=capacity,
        leanest_arrays=lean1,
        leanest_needed_bytes=lean1_needed,
        stats=stats,
        unscored_at_least_s=tuple(float(t) for t in search._thresholds()),
    )


def _skeleton_bounds(skeletons, scorer, space):
    """Per skeleton, its leanest completion (micro-batch 1, the recompute level that holds least) and what it
    needs: what the no-fit message reports (computed only when nothing fits)."""
    lean = leanest(skeletons, space=space)
    needed = scorer(lean).needed
    levels = len(space.recompute)
    best = np.argmin(needed.reshape(-1, levels), axis=1)
    pick = np.arange(len(best)) * levels + best
    return _take(lean, pick), needed[pick]


class _BranchAndBound:
    """Best-first search over shapes with the bounds of the module docstring.

    A group is a row (skeleton and micro-batch) with a placement and a sequence-parallel choice; its members
    are the recompute levels. A shape is a run of rows equal in SHAPE_FIELDS (they differ only in ZeRO stage,
    dp_shard and offload) with a class of placements (`placement_classes`) and both sequence-parallel choices.
    Premises, checked on the real scorer in tests/test_search_bounds.py: the bound terms (TIME_BOUND_TERMS)
    never exceed the step and never fall from one recompute level to the next within a group (least at its
    "first", the weakest level); the shape terms (SHAPE_BOUND_TERMS) and the pipeline p2p do not depend on the
    model-state knobs, the shape terms not on the placement within a class, and they are never less with
    sequence parallelism off; the optimizer step depends on the skeleton only; sequence parallelism on never
    needs more memory than off; the placement moves no memory.

    So one evaluation per shape (its representative's first, sequence parallelism on where tp > 1) bounds from
    below every candidate of the shape. Shapes are expanded in growing batches -- those whose representative
    fits and is fast first, so that the admission threshold falls soon -- while their bound is below the
    threshold (which only falls as feasible candidates are found); the others are proven out. Expanding
    shapes scores the representative row's groups and one group of every skeleton not seen yet (giving each
    group's p2p and optimizer terms), then the firsts of the other groups whose shape terms + p2p + optimizer
    are below the threshold, then each stronger recompute level of the groups whose previous level's bound is
    below it, except members with sequence parallelism off whose twin with it on (same row and level, any
    placement) was scored and does not fit.

    Rows are sorted by shape with the leanest model states first (highest ZeRO stage, all-rank shard group,
    optimizer offload), so a shape's rows are a run and its representative, the run's first row, is the
    likeliest to fit and to set an early threshold."""

    FIRST_BATCH = 512
    """Shapes expanded in the first batch (each later batch is BATCH_GROWTH times larger: few batches keep
    the scorer's fixed cost per call small, while the threshold still tightens between them)."""
    BATCH_GROWTH = 4

    def __init__(
        self, rows, *, space, scorer, capacity, objective, keep, prune, time_bound, progress
    ):
        self.space, self.scorer, self.capacity, self.objective, self.keep = (
            space,
            scorer,
            capacity,
            objective,
            keep,
        )
        self.prune, self.time_bound, self.progress = prune, time_bound, progress
        self.levels = [RECOMPUTE.index(r) for r in space.recompute]
        self.weakest = min(self.levels)
        n = len(rows["dp"])
        lean = (
            rows["zero"] * 4
            + (rows["dp_shard"] == 0) * 2
            + np.isin(rows["offload"], offload_indices("optimizer"))
        )
        key = packed_key([rows[k] for k in SHAPE_FIELDS]) if n else np.zeros(0, dtype=np.int64)
        order = np.argsort(key * 16 + (15 - lean), kind="stable")
        self.rows = {k: np.asarray(v)[order] for k, v in rows.items()}
        key = key[order]
        self.starts = (
            np.r_[0, np.flatnonzero(np.diff(key)) + 1] if n else np.zeros(0, dtype=np.int64)
        )
        self.ends = np.r_[self.starts[1:], n]
        self._shapes()
        self.total = int(self.shape_groups.sum()) * len(self.levels)
        self.needed_on = np.full(
            (n, len(RECOMPUTE)), np.nan
        )  # what members with sequence parallelism on need
        self.optimizer_s = np.full(
            int(self.rows["skeleton"].max()) + 1 if n else 0, np.nan
        )  # per skeleton
        self.pruned_memory = self.bound_evaluations = self.done = 0
        self.parts: list[tuple] = []
        self.feasible_steps: list[np.ndarray] = []
        self.feasible_cls: list[np.ndarray] = []
        self.cls = self.rows["cp"][self.starts[self.shape_run]] > 1
        self.both = bool(self.cls.any() and not self.cls.all())

    def _shapes(self) -> None:
        """The shapes: each run of rows with each placement class (`placement_classes`) of its pattern; a
        shape holds both sequence-parallel choices, bounded by its representative with it on (where tp > 1)."""
        first = {k: v[self.starts] for k, v in self.rows.items()}
        runs, classes, sp_sets = [], [], []
        self.class_places: list[tuple[int, ...]] = []
        self.sp_choices: list[tuple[bool, ...]] = []
        for sp, place, mask in _pattern_groups(first, self.space):
            ids = []
            for members in placement_classes(
                place, exact=bool(np.any(first.get("ep", np.ones(1))[mask] > 1))
            ):
                if members not in self.class_places:
                    self.class_places.append(members)
                ids.append(self.class_places.index(members))
            sp = tuple(
                sorted(set(bool(v) for v in sp), reverse=True)
            )  # on first: the representative's
            if sp not in self.sp_choices:
                self.sp_choices.append(sp)
            mine = np.flatnonzero(mask)
            runs.append(np.repeat(mine, len(ids)))
            classes.append(np.tile(ids, len(mine)))
            sp_sets.append(np.full(len(mine) * len(ids), self.sp_choices.index(sp)))
        cat = lambda parts: (
            np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        )  # noqa: E731
        self.shape_run, self.shape_class, self.shape_sps = cat(runs), cat(classes), cat(sp_sets)
        self.n_shapes = len(self.shape_run)
        per_class = np.array([len(c) for c in self.class_places], dtype=np.int64)
        per_sp = np.array([len(c) for c in self.sp_choices], dtype=np.int64)
        self.shape_groups = (
            (self.ends - self.starts)[self.shape_run]
            * per_class[self.shape_class]
            * per_sp[self.shape_sps]
            if self.n_shapes
            else np.zeros(0, dtype=np.int64)
        )
        first_sp = np.array([c[0] for c in self.sp_choices], dtype=bool)
        self.shape_sp = first_sp[self.shape_sps] if self.n_shapes else np.zeros(0, dtype=bool)

    @property
    def pruned_time(self) -> int:
        """Everything neither scored nor dropped by the memory bound was proven out by a time bound."""
        return self.total - self.done - self.pruned_memory

    def _members(
        self, row: np.ndarray, place: np.ndarray, sp: np.ndarray, levels
    ) -> dict[str, np.ndarray]:
        """Rows with a placement and sequence-parallel choice each, at one recompute level or at each of `levels`."""
        out = {
            k: self.rows[k][row]
            for k in FIELDS
            if k not in ("placement", "sequence_parallel", "recompute")
        }
        out["placement"], out["sequence_parallel"], out["row"] = place, sp, row
        if np.ndim(levels) == 0:
            out["recompute"] = np.full(len(row), levels, dtype=np.int64)
            return out
        return _product(out, "recompute", np.asarray(levels))

    def _tick(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)

    def _thresholds(self) -> tuple[float, float]:
        """Admission threshold per cp class (cp = 1, cp > 1; `_class_thresholds`) over every feasible
        candidate known: those scored, and the representatives' firsts of shapes not yet expanded (an
        expanded shape's are among the scored, so none is counted twice)."""
        if not self.time_bound:
            return np.inf, np.inf
        pending = ~self.expanded & np.isfinite(self.rep_step)
        steps = np.concatenate(self.feasible_steps + [self.rep_step[pending]])
        cls = np.concatenate(self.feasible_cls + [self.cls[pending]])
        return _class_thresholds(
            cls, steps, objective=self.objective, keep=self.keep, both=self.both
        )

    def _threshold_of(self, members) -> np.ndarray:
        thr = self._thresholds()
        return np.where(np.asarray(members["cp"]) > 1, thr[1], thr[0])

    def _score(self, members) -> _Scores:
        if not len(members["dp"]):
            return _Scores.empty()
        arrays = {k: members[k] for k in FIELDS}
        r = self.scorer(arrays, self._tick)
        self.parts.append((arrays, r.step, r.peak, r.needed))
        ok = (r.needed <= self.capacity) & np.isfinite(r.step)
        self.feasible_steps.append(r.step[ok])
        self.feasible_cls.append(np.asarray(arrays["cp"])[ok] > 1)
        on = np.asarray(members["sequence_parallel"], bool)
        self.needed_on[members["row"][on], members["recompute"][on]] = r.needed[on]
        return r

    def run(self) -> None:
        first_place = np.array([c[0] for c in self.class_places], dtype=np.int64)
        reps = self._members(
            self.starts[self.shape_run],
            first_place[self.shape_class] if self.n_shapes else np.zeros(0, dtype=np.int64),
            self.shape_sp,
            self.weakest,
        )
        r = self.scorer({k: reps[k] for k in FIELDS}) if self.n_shapes else _Scores.empty()
        self.bound_evaluations += self.n_shapes
        lb = self.shape_lb = r.shape_bound
        ok = (r.needed <= self.capacity) & np.isfinite(r.step)
        self.rep_step = np.where(
            ok, r.step, np.inf
        )  # the representatives' firsts: known feasible steps
        self.expanded = np.zeros(self.n_shapes, bool)
        # expand first the shapes whose representative fits and is fast (the threshold falls soonest), then
        # the others by their bound; the order only sets how soon the threshold falls, never what is proven
        order = np.lexsort((lb, self.rep_step))
        batch = self.FIRST_BATCH
        while len(order):
            thr = self._thresholds()
            order = order[lb[order] < np.where(self.cls[order], thr[1], thr[0])]
            take, order = order[:batch], order[batch:]
            if len(take):
                self._expand(take)
            batch *= self.BATCH_GROWTH

    def _expand(self, shapes: np.ndarray) -> None:
        """Score the candidates of these shapes (class docstring)."""
        self.expanded[shapes] = True
        rows, places, sps, owner = [], [], [], []
        for c, k in {
            (int(c), int(k)) for c, k in zip(self.shape_class[shapes], self.shape_sps[shapes])
        }:
            mine = shapes[(self.shape_class[shapes] == c) & (self.shape_sps[shapes] == k)]
            run = self.shape_run[mine]
            lengths = self.ends[run] - self.starts[run]
            for p in self.class_places[c]:
                for choice in self.sp_choices[k]:
                    rows.append(_ranges(self.starts[run], lengths))
                    places.append(np.full(int(lengths.sum()), p, dtype=np.int64))
                    sps.append(np.full(int(lengths.sum()), choice, dtype=bool))
                    owner.append(np.repeat(mine, lengths))
        row, place, sp, shape = (np.concatenate(x) for x in (rows, places, sps, owner))
        # A group's bound is its shape's terms plus its pipeline p2p (the same for every row of the shape, given
        # the placement and sequence-parallel choice) and its skeleton's optimizer step (the same for every group
        # of the skeleton). Score first the representative row's groups and one group of each skeleton not seen
        # yet, then only the firsts whose shape terms + p2p + optimizer are below the threshold.
        skeleton = self.rows["skeleton"][row]
        rep = row == self.starts[self.shape_run[shape]]
        unknown = np.flatnonzero(np.isnan(self.optimizer_s[skeleton]) & ~rep)
        first_seen = unknown[np.unique(skeleton[unknown], return_index=True)[1]]
        probe = np.union1d(
            np.flatnonzero(rep), first_seen[np.isnan(self.optimizer_s[skeleton[first_seen]])]
        )
        members = self._members(row[probe], place[probe], sp[probe], self.weakest)
        r = self._score(members)
        self.optimizer_s[skeleton[probe]] = r.terms["optimizer"]
        live_parts = [probe[r.bound < self._threshold_of(members)]]
        p2p_key = (shape * len(PLACEMENTS) + place) * 2 + sp
        known = p2p_key[probe][rep[probe]]
        order = np.argsort(known)
        rest = np.setdiff1d(np.arange(len(row)), probe, assume_unique=True)
        at = np.clip(np.searchsorted(known[order], p2p_key[rest]), 0, max(len(known) - 1, 0))
        p2p = r.terms["pp_p2p_bound"][rep[probe]][order][at] if len(known) else np.zeros(len(rest))
        lb = self.shape_lb[shape[rest]] + p2p + self.optimizer_s[skeleton[rest]]
        rest = rest[lb < self._threshold_of({"cp": self.rows["cp"][row[rest]]})]
        if len(rest):
            members = self._members(row[rest], place[rest], sp[rest], self.weakest)
            r = self._score(members)
            live_parts.append(rest[r.bound < self._threshold_of(members)])
        live = np.concatenate(live_parts) if live_parts else np.zeros(0, dtype=np.int64)
        row, place, sp = row[live], place[live], sp[live]
        for level in sorted(self.levels)[1:]:
            # a stronger level only where the previous one's bound (for a member skipped for memory, the last
            # bound known) is below the threshold: the bound grows along RECOMPUTE
            if not len(row):
                return
            on = self._members(row[sp], place[sp], sp[sp], level)  # sequence parallelism on first
            r_on = self._score(on)
            off_at = np.flatnonzero(~sp)
            twin_needed = self.needed_on[row[off_at], level]  # NaN: the twin is not scored (yet)
            skip = twin_needed > self.capacity if self.prune else np.zeros(len(off_at), bool)
            self.pruned_memory += int(skip.sum())
            off = self._members(row[off_at[~skip]], place[off_at[~skip]], sp[off_at[~skip]], level)
            r_off = self._score(off)
            keep = np.ones(len(row), bool)
            keep[np.flatnonzero(sp)] = r_on.bound < self._threshold_of(on)
            keep[off_at[~skip]] = r_off.bound < self._threshold_of(off)
            row, place, sp = row[keep], place[keep], sp[keep]

    def result(self):
        full = {
            k: np.concatenate([p[0][k] for p in self.parts])
            if self.parts
            else np.zeros(0, dtype=np.int64)
            for k in FIELDS
        }
        cols = [
            np.concatenate([p[i] for p in self.parts]) if self.parts else np.zeros(0)
            for i in (1, 2, 3)
        ]
        return full, *cols


def placement_classes(placements, *, exact: bool = False) -> list[tuple[int, ...]]:
    """Indices into PLACEMENTS grouped by their letters from T to the end: placements of one class lay the
    tensor- and context-parallel groups (C sits just left of T) on the same ranks, so the terms of
    SHAPE_BOUND_TERMS, which only read those groups, are equal across the class (checked in
    tests/test_search.py); "DPT" and "PDT" share one, Megatron's two rank orders. With expert parallelism
    (`exact`) each placement is its own class: the expert layers regroup a pipeline stage's ranks, whose
    layout depends on the whole order (placement.stage_group_locality)."""
    out: dict[str, list[int]] = {}
    for index in placements:
        text = PLACEMENTS[index]
        out.setdefault(text if exact else text[text.index("T") :], []).append(int(index))
    return [tuple(v) for v in out.values()]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start, start + 1, ..., start + length - 1 of every range, concatenated."""
    total = int(lengths.sum())
    offsets = np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    return offsets + np.arange(total)


def _no_space_reason(world, global_batch, heads, blocks, rejected) -> str:
    reasons = "; ".join(f"{k}: {v}" for k, v in sorted(rejected.items()))
    return (
        f"a world size with at least one valid (dp, tp, pp, cp): tp | heads({heads}), pp <= blocks({blocks}), "
        f"seq % (2 cp) == 0, dp | global_batch({global_batch}); every split of {world} was rejected ({reasons})"
    )


SEARCHED_DIMENSIONS = ("cp", "cp_comm", "dp_shard", "ep")
"""The dimensions beyond dp x tp x pp whose values the search reports (SearchStats.values_tried)."""


def held_dimensions(framework, model) -> dict[str, str]:
    """Dimensions `framework` holds at 1 for `model` (SearchSpace.for_framework narrows them), each with the reason
    and what would lift it, for recommend to say: a stack that runs multi-token-prediction modules only without
    pipeline or context parallelism (frameworks.rules.mtp_without_pp_or_cp)."""
    from frameworks.rules import mtp_without_pp_or_cp

    if not mtp_without_pp_or_cp(framework, model):
        return {}
    why = (
        f"{framework.name} runs the model's {model.mtp_modules} multi-token-prediction module(s) only with pp = cp "
        f"= 1 (frameworks/{framework.name}.json: mtp_with_pp_or_cp false); without them (a config.json without "
        "num_nextn_predict_layers) the search pipelines the model"
    )
    return {"pp": why, "cp": why}


def values_tried(rows: Mapping[str, np.ndarray]) -> dict[str, list]:
    """The distinct cp, cp_comm (names), dp_shard and ep values among candidate rows (the skeletons the
    rules admit, before any bound): what `explain` reports as tried."""
    out = {
        name: sorted(int(v) for v in np.unique(rows[name]))
        for name in SEARCHED_DIMENSIONS
        if name in rows
    }
    if "cp_comm" in out:
        out["cp_comm"] = [CP_COMMS[i] for i in out["cp_comm"]]
    return out


def ep_costed() -> bool:
    """Whether the cost model prices expert parallelism (cost_models.step.Step reads an `ep` array). Until
    it does, an ep > 1 candidate would score exactly as its ep = 1 twin and planner.estimate refuses it, so
    the search enumerates ep but scores only ep = 1 (`_costed`)."""
    from dataclasses import fields

    from cost_models.step import Step

    return "ep" in {f.name for f in fields(Step)}


def _costed(rows: Mapping[str, np.ndarray], rejected: Counter) -> dict[str, np.ndarray]:
    """Skeleton rows the cost model can price: all of them once ep_costed(), else those with ep = 1 (the
    others counted under their reason)."""
    if "ep" not in rows or ep_costed():
        return dict(rows)
    mask = rows["ep"] == 1
    if (~mask).any():
        rejected["ep > 1 not costed by this build (scores as ep = 1; skeletons)"] += int(
            (~mask).sum()
        )
    return _take(rows, mask)


def _class_thresholds(
    cls: np.ndarray, steps: np.ndarray, *, objective: str, keep: int, both: bool
) -> tuple[float, float]:
    """Admission thresholds (cp = 1, cp > 1) from the feasible steps known so far and their classes (cp > 1):
    the global one (`_admission_threshold`) and, when the space holds both classes, each raised to its
    class's best known step (infinite while none is known), so that the best plan of each class is scored
    exactly: recommend compares the winner with the best plan of the other class. A candidate whose bound
    reaches its class's best known step cannot be the best of that class."""
    steps = np.asarray(steps, dtype=float)
    glob = _admission_threshold(steps, np.zeros(len(steps)), 0.0, objective, keep)
    if not both:
        return glob, glob
    out = []
    for c in (False, True):
        mine = steps[cls == c]
        out.append(max(glob, mine.min() * (1 + 1e-12) if len(mine) else np.inf))
    return out[0], out[1]


def rank(scored: ScoredSpace, objective: str) -> np.ndarray:
    """Indices of the feasible candidates, best first, for the objective (ties: less memory first)."""
    if objective not in OBJECTIVES:
        raise ConfigError("objective", objective, "one of " + ", ".join(OBJECTIVES))
    idx = np.flatnonzero(
        scored.fits & np.isfinite(scored.step_time_s)
    )  # an infinite step is never ranked
    step, peak = scored.step_time_s[idx], scored.peak_bytes_per_gpu[idx]
    if objective == "memory" and len(idx):
        near = step <= step.min() * (1 + MEMORY_OBJECTIVE_SLACK)
        idx, step, peak = idx[near], step[near], peak[near]
        return idx[np.lexsort((step, peak))]
    return idx[np.lexsort((peak, step))]


# ----------------------------------------------------------------------------------------- no fit


def no_fit_error(
    scored: ScoredSpace,
    *,
    model,
    hardware,
    world_size: int,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str,
    space: SearchSpace,
    framework: str = "megatron",
    held: dict[str, str] | None = None,
) -> NoFitError:
    """How far the leanest candidate misses and what would make one fit (exit 3). `held` names the run option
    that kept a knob out of the search (e.g. full recompute: moe_a2a_overlap), where it was not the framework."""
    i = int(np.argmin(scored.leanest_needed_bytes))
    need = float(scored.leanest_needed_bytes[i])
    cap = scored.capacity_bytes
    cfg = config_of(
        scored.leanest_arrays,
        i,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        framework=framework,
    )
    per_node = hardware.devices_per_node
    more = math.ceil(world_size * need / cap / per_node) * per_node
    fixes = [
        f"more GPUs (about {more}, {more // per_node} nodes: static memory shrinks roughly as 1/GPUs)"
    ]
    untried = []
    if 3 not in space.zero:
        untried.append("ZeRO-3")
    if "full" not in space.recompute:
        untried.append("full recompute")
    if "optimizer" not in space.offload:
        untried.append("optimizer offload")
    held = held or {}
    by_option = [f"{knob} (held by {held[knob]})" for knob in untried if knob in held]
    by_stack = [knob for knob in untried if knob not in held]
    if by_stack:
        fixes.append(
            "allow "
            + ", ".join(by_stack)
            + f" (not available on {framework}: try another --framework)"
        )
    if by_option:
        fixes.append("drop the run option that holds " + ", ".join(by_option))
    bigger = _larger_devices(hardware, need)
    if bigger:
        fixes.append("a larger device (" + ", ".join(bigger) + ")")
    fixes.append("a shorter --seq")
    cp = f" cp={cfg.cp}" if cfg.cp > 1 else ""
    tried = (
        f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp}{cp} micro_batch=1 zero={cfg.zero} recompute={cfg.recompute} "
        f"offload={cfg.offload}, the least memory over every degree, ZeRO stage, recompute and offload searched"
    )
    return NoFitError(
        f"no plan fits in {cap / 2**30:.1f} GiB per GPU on {world_size} x {hardware.name}: the leanest candidate "
        f"({tried}) needs {need / 2**30:.1f} GiB, {(need - cap) / 2**30:.1f} GiB ({need / cap - 1:.0%}) too much; "
        f"it would fit with " + "; or ".join(fixes)
    )


def non_finite_error(scored: ScoredSpace, hardware) -> ConfigError:
    """Candidates fit but none has a finite step time: the profile makes some term impossible."""
    n = int(np.sum(scored.fits & ~np.isfinite(scored.step_time_s)))
    return ConfigError(
        "hardware",
        hardware.name,
        "a profile with positive efficiencies and bandwidths",
        message=f"hardware={hardware.name!r}: every candidate that fits ({n:,}) has an infinite or "
        f"undefined step time; a zero efficiency, rate or bandwidth in the profile makes "
        f"some term impossible",
    )


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
    from planner.partition import PartitionProblem

    sw = software or software_for(cfg.framework)
    b, s, tp = cfg.micro_batch, cfg.seq, cfg.tp
    blocks = model.total_blocks
    block_work = (
        F.block_flops_fwd(model, b, s)
        + F.block_flops_bwd(model, b, s)
        + F.block_recompute_flops(
            model, b, s, cfg.recompute, selective=sw.framework.selective_recompute
        )
    ) / tp
    head_work = 3 * F.head_flops_fwd(model, b, s) / tp
    pb, gb, ob = state_bytes_per_param(sw, cfg.precision, cfg.optimizer)
    dp = cfg.shard_group
    shard = (
        (pb / (dp if cfg.zero >= 3 else 1))
        + (gb / (dp if cfg.zero >= 2 else 1))
        + (ob / (dp if cfg.zero >= 1 else 1))
    )
    block_static = P.block_params(model) / tp * shard
    from cost_models.step import activation_precision

    act = dict(
        precision=activation_precision(sw, cfg.precision, cfg.zero), tp=tp, sp=cfg.sequence_parallel
    )
    # the block as the run saves it: the table and selective policy estimate reads (its options included)
    block_act = A.block_bytes_of(
        sw,
        model,
        b,
        s,
        precision=cfg.precision,
        zero=cfg.zero,
        tp=tp,
        sp=cfg.sequence_parallel,
        recompute=cfg.recompute,
    )
    # with pp > 1 a tied output head is a second copy on the last stage, summed with the embedding's
    # gradient once per step (Megatron's embedding group; Shoeybi et al. 2019)
    tied_copy = model.vocab * model.hidden if model.tied_embeddings else 0
    chunks = cfg.pp * cfg.virtual_stages
    inflight = tuple(
        max(1, cfg.pp - (c % cfg.pp)) if cfg.schedule != "gpipe" else cfg.num_microbatches
        for c in range(chunks)
    )
    return PartitionProblem(
        block_work=(float(block_work),) * blocks,
        block_static_bytes=(float(block_static),) * blocks,
        block_activation_bytes=(float(block_act),) * blocks,
        pp=cfg.pp,
        virtual_stages=cfg.virtual_stages,
        first_work=0.0,
        first_static_bytes=P.embedding_params(model) / tp * shard,
        first_activation_bytes=float(A.embedding_bytes(model, b, s, dropout=sw.dropout, **act)),
        last_work=float(head_work),
        last_static_bytes=(P.head_params(model) + P.final_norm_params(model) + tied_copy)
        / tp
        * shard,
        last_activation_bytes=float(A.head_bytes(model, b, s, kernels=sw.framework.kernels, **act)),
        inflight=inflight,
    )


def fewest_recomputed_layers(
    model,
    hardware,
    cfg: ParallelConfig,
    *,
    software,
    capacity: float,
    score_fn=None,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str,
) -> int | None:
    """For a plan with full recomputation, the number of blocks per pipeline chunk to recompute
    (ParallelConfig.recompute_layers) that gives the shortest step and still fits: every count from 1 to the
    largest chunk's blocks less one scored at once by the vectorized cost model (fewer recomputed blocks:
    less time, more memory). None when the framework recomputes every block only
    (capabilities.recompute_layers), the plan does not recompute fully, or no smaller count fits."""
    if (
        cfg.recompute != "full"
        or not software.framework.capabilities.recompute_layers
        or not hasattr(model, "total_blocks")
    ):
        return None
    from planner.estimate import candidate_of
    from planner.score import CandidateArrays

    if score_fn is None:
        from planner.score import score as score_fn
    counts = np.arange(1, cfg.largest_chunk(model.total_blocks))
    if len(counts) == 0:
        return None
    one = candidate_of(replace(cfg, recompute_layers=None), model.total_blocks)
    arrays = {
        f: (None if getattr(one, f) is None else np.repeat(getattr(one, f), len(counts), axis=0))
        for f in CandidateArrays.__dataclass_fields__
    }
    arrays["recompute_layers"] = counts
    scores = score_fn(
        model,
        hardware,
        CandidateArrays(**arrays),
        software=software,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
    )
    needed = np.asarray(getattr(scores, "needed_bytes", scores.peak_bytes_per_gpu), dtype=float)
    step = np.asarray(scores.step_time_s, dtype=float)
    ok = (needed <= capacity) & np.isfinite(step)
    if not ok.any():
        return None
    return int(counts[ok][np.argmin(step[ok])])


def uneven_stages(model, cfg: ParallelConfig, software=None) -> tuple[int, ...]:
    """The fastest contiguous split of the blocks for cfg (empty when pp = 1 or the model has no blocks), weighed
    with the run's software (its options change what a block saves; stage_problem)."""
    from planner.partition import even_split, split

    if cfg.pp == 1 or not hasattr(model, "total_blocks"):
        return ()
    if cfg.virtual_stages > 1 and cfg.pp * cfg.virtual_stages > CPSAT_MAX_CHUNKS:
        return ()
    try:
        part = split(stage_problem(model, cfg, software), time_limit_s=CPSAT_TIME_LIMIT_S)
    except ConfigError:  # no split within the limits: keep the even one
        return ()
    return (
        ()
        if part.stages == even_split(model.total_blocks, cfg.pp * cfg.virtual_stages)
        else part.stages
    )


# -------------------------------------------------------------------------------------- documents


def _with_cost(
    document: dict,
    price_per_hour: float | None,
    spot: bool,
    tokens: float | None,
    hardware=None,
    reliability=None,
) -> dict:
    """Dollars per step and per 1B tokens; with `tokens`, the time and cost to train including failures,
    checkpoints and restarts (planner.goodput) beside the failure-free figures."""
    pred = document["prediction"]
    step = pred["step_time_s"]
    tokens_per_step = document["plan"]["global_batch"] * document["plan"]["seq"]
    if price_per_hour is not None:
        usd_step = price_per_hour * step / 3600.0
        pred["cost"] = {
            "usd_per_hour": price_per_hour,
            "usd_per_step": usd_step,
            "usd_per_1b_tokens": usd_step / tokens_per_step * 1e9,
            "spot": spot,
        }
    if tokens:
        train = {"tokens": tokens, "steps": math.ceil(tokens / tokens_per_step)}
        train["seconds"] = train["steps"] * step
        train["days"] = train["seconds"] / 86400.0
        if price_per_hour is not None:
            train["usd"] = price_per_hour * train["seconds"] / 3600.0
        if hardware is not None:
            from planner.goodput import reliability_figures, with_reliability

            figures = reliability_figures(
                document,
                hardware,
                tokens=tokens,
                price_per_hour=price_per_hour,
                inputs=reliability,
                spot=spot,
            )
            with_reliability(document, figures)
            train = {
                "tokens": tokens,
                "steps": train["steps"],
                "seconds": figures["time_to_train_s"],
                "days": figures["time_to_train_s"] / 86400.0,
                "seconds_without_failures": train["seconds"],
                "days_without_failures": train["days"],
            }
            if price_per_hour is not None:
                train |= {
                    "usd": figures["usd"],
                    "usd_without_failures": figures["usd_without_failures"],
                }
        pred["to_train"] = train
    return document


def key_numbers(document: Mapping[str, Any]) -> dict:
    """What `explain` needs of a runner-up: its plan and the deciding numbers."""
    pred = document["prediction"]
    return {
        "plan": dict(document["plan"]),
        "step_time_s": pred["step_time_s"],
        "peak_bytes_per_gpu": int(pred["memory"]["peak_bytes_per_gpu"]),
        "fits": bool(pred["memory"]["fits"]),
        "mfu": pred.get("mfu"),
        "time_breakdown_s": dict(pred["time_breakdown_s"]),
        "memory": dict(pred["memory"]),
    }


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
        raise ConfigError(
            "tokens",
            tokens,
            "a training length with --objective time-to-train",
            message="--objective time-to-train needs --tokens N (the length of the run, e.g. 300B)",
        )
    if inputs.given and not tokens:
        flag = inputs.given[0]
        raise ConfigError(
            flag.lstrip("-"),
            getattr(inputs, flag.lstrip("-").replace("-", "_")),
            "--tokens N as well",
            message=f"{flag} needs --tokens N: goodput is computed for a run of N tokens",
        )
    if inputs.spot_interruptions_per_node_hour is not None and not spot:
        raise ConfigError(
            "spot-interruptions-per-node-hour",
            inputs.spot_interruptions_per_node_hour,
            "only with --spot (on-demand nodes are not reclaimed)",
        )
    if spot and objective == "time-to-train" and inputs.spot_interruptions_per_node_hour is None:
        raise ConfigError(
            "spot-interruptions-per-node-hour",
            None,
            "your spot reclaim rate per node-hour with --spot "
            "--objective time-to-train (it varies by instance type, zone and hour; no default)",
            message="--spot with --objective time-to-train needs --spot-interruptions-per-node-hour "
            "RATE (reclaims per node-hour; it varies by instance type, zone and hour, so the "
            "planner has no default)",
        )
    return inputs.validated()


# ----------------------------------------------------------------------------------------- recommend


def _cp_versus(
    scored: ScoredSpace, objective: str, winner: Mapping[str, Any], document
) -> dict | None:
    """Why the winner's context-parallel degree: the key numbers (`key_numbers`) of the best plan of the
    other cp class (cp = 1 when the winner has cp > 1, else cp > 1), documented as the leaders are (`document`
    of its index in the scored arrays); None when the space had one class only. The search scores the best
    plan of each class exactly (`_class_thresholds`); under the memory objective the other class's fastest.
    A class with no plan that fits gives its leanest miss:
    {"fits": false, "cp": ...} with the least memory any scored candidate of that class needs."""
    cp = (
        np.asarray(scored.arrays["cp"])
        if "cp" in scored.arrays
        else np.ones(len(scored.step_time_s), int)
    )
    if len(np.unique(cp > 1)) < 2:
        return None
    other = (cp > 1) != (winner["plan"].get("cp", 1) > 1)
    order = rank(
        scored, "throughput" if objective == "memory" else objective
    )  # memory: its fastest plan
    mine = order[other[order]]
    if len(mine):
        out = key_numbers(document(int(mine[0])))
        out["fits"] = bool(out["fits"])
        return out
    i = int(np.flatnonzero(other)[np.argmin(scored.needed_bytes[other])])
    return {
        "fits": False,
        "cp": 1 if winner["plan"].get("cp", 1) > 1 else int(cp[i]),
        "needed_bytes": int(scored.needed_bytes[i]),
        "capacity_bytes": int(scored.capacity_bytes),
    }


def _documented_scores(row):
    """One candidate's scores as estimate() documents them: off the step timeline when estimate
    reads it there (planner.estimate.STEP_MODEL), so a class compared in explain and its plan file
    give the same numbers."""
    if estimate_module.STEP_MODEL == "timeline":
        return estimate_module.timeline_scores(row)
    return row


def _ep_versus(
    scored: ScoredSpace,
    objective: str,
    model,
    hardware,
    software,
    documented,
    *,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str,
) -> dict | None:
    """Why the winner's expert-parallel degree and placement: the best fitting plan of each expert-parallel class
    -- an ep degree and where its all-to-all runs (cost_models.moe.EP_LINKS: inside one NVLink domain, or over
    NVLink and the network) -- best class first, with its key numbers (`key_numbers`) and expert layout
    (cost_models.moe.placement_summary: links, experts per GPU, imbalance, exchange time).

    A class with one of the search's leaders takes its best leader's plan document (`documented`: (row, document)
    pairs, uneven stages where refining helped; one that fits first, as recommend ranks them: estimate checks
    every pipeline rank's memory, the search the first and the last), as the winner does; any other class its
    fastest scored plan as
    scored (even stages; `as_scored` true), which is slower at even stages than every leader. `exact`: no plan of
    the class the search did not score can be faster than its fastest scored one (that one is within
    ScoredSpace.unscored_at_least_s); else `unscored_at_least_s` is the least step time the rest could have. None
    for a dense model or a search with one class. Under the memory objective the classes' fastest plans."""
    from cost_models.compute import block_seconds
    from cost_models.moe import EP_LINKS, ep_links, placement_summary
    from cost_models.step import Step
    from planner.estimate import Estimate, even_stages
    from planner.placement import group_locality
    from planner.score import score

    if getattr(model, "moe", None) is None or "ep" not in scored.arrays:
        return None
    by = "throughput" if objective == "memory" else objective
    order = rank(scored, by)
    a = {k: np.asarray(scored.arrays[k])[order] for k in FIELDS}
    local = group_locality(
        a["placement"],
        a["dp"],
        a["pp"],
        a["tp"],
        hardware.nvlink_domain_devices,
        cp=a["cp"],
        dp_shard=np.where(a["dp_shard"] > 0, a["dp_shard"], a["dp"]),
        ep=a["ep"],
    )["E"]
    cls = a["ep"] * len(EP_LINKS) + ep_links(a["ep"], local)
    firsts = np.sort(
        np.unique(cls, return_index=True)[1]
    )  # each class's fastest scored, in rank order
    if len(firsts) < 2:
        return None
    floor = min(scored.unscored_at_least_s)
    best_doc: dict[int, dict] = {}
    for _, doc in documented:  # fitting documents first (as recommend ranks them), then the fastest
        ep = doc["prediction"]["expert_parallel"]
        key = ep["ep"] * len(EP_LINKS) + EP_LINKS.index(ep["links"])
        value = (not doc["prediction"]["memory"]["fits"], *_objective_value(doc, by))
        if key not in best_doc or value < best_doc[key][0]:
            best_doc[key] = (value, doc)
    plain = [j for j in firsts if int(cls[j]) not in best_doc]
    entries = {}
    if plain:
        rows = {k: v[plain] for k, v in a.items()}
        cands = _candidate_arrays(rows)
        kw = dict(global_batch=global_batch, seq=seq, precision=precision, optimizer=optimizer)
        scores = score(model, hardware, cands, software=software, **kw)
        x = Step.of(model, hardware, software, cands, **kw)
        block = block_seconds(x)
        for n, j in enumerate(plain):
            cfg = config_of(rows, n, framework=software.framework.name, **kw)
            cfg = replace(
                cfg, stages=tuple(even_stages(model.total_blocks, cfg.pp * cfg.virtual_stages))
            )
            one = Estimate(
                model=model,
                hardware=hardware,
                config=cfg,
                gpus=cfg.world_size,
                software=software,
                scores=_documented_scores(
                    replace(_score_row(scores, n), step=x.take(np.array([n])))
                ),
            )
            entries[int(cls[j])] = {
                "plan": cfg.to_dict(),
                "step_time_s": one.step_time_s,
                "peak_bytes_per_gpu": one.peak_bytes_per_gpu,
                "fits": one.fits,
                "mfu": one.mfu,
                "time_breakdown_s": one.time_breakdown_s(),
                "memory": one.memory(),
                "expert_parallel": placement_summary(x, block, n),
                "as_scored": True,
            }
    for key, (_, doc) in best_doc.items():
        entries[key] = {
            **key_numbers(doc),
            "expert_parallel": dict(doc["prediction"]["expert_parallel"]),
            "as_scored": False,
        }
    classes = []
    for j in firsts:
        entry = entries[int(cls[j])]
        exact = bool(scored.step_time_s[order[j]] <= floor)
        classes.append({**entry, "exact": exact, "unscored_at_least_s": None if exact else floor})
    classes.sort(key=lambda e: (e["step_time_s"], e["peak_bytes_per_gpu"]) if by != "memory" else 0)
    network = str(getattr(hardware, "inter_node_interconnect", "") or "network").split(" (")[0]
    return {"network": network, "classes": classes}


def _score_row(scores, j: int):
    """Candidate j of a batch's Scores as length-1 arrays (what Estimate reads)."""
    from dataclasses import fields as dc_fields

    n = len(np.atleast_1d(scores.step_time_s))
    out = {}
    for f in dc_fields(scores):
        v = getattr(scores, f.name)
        if isinstance(v, np.ndarray) or (np.ndim(v) and f.name != "stage_memory"):
            v = np.broadcast_to(np.asarray(v), (n,) + np.shape(v)[1:])[j : j + 1]
        out[f.name] = (
            None if f.name in ("stage_memory", "step") else v
        )  # the batch's, not this row's
    return type(scores)(**out)


def check_space(space: SearchSpace, model, framework, *, world: int, seq: int) -> None:
    """The pinned and limited values of the new dimensions (recommend --cp/--max-cp/--cp-comm/--dp-shard/--ep/
    --max-ep) checked against the framework's capabilities (frameworks.rules' vocabulary), the model and the
    sequence: one ConfigError naming the flag, the value and what is allowed."""
    from planner.candidates import cp_comm_allowed
    from planner.parallel import expert_parallel_degrees

    from frameworks.rules import check_model_runnable, mtp_without_pp_or_cp

    caps, name = framework.capabilities, framework.name
    check_model_runnable(framework, model)
    heads, kv_heads, _ = _model_shape(model)
    for flag, value in (("max-cp", space.max_cp), ("max-ep", space.max_ep)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(flag, value, "a positive integer")
    for c in space.cp_comm:
        if c not in CP_COMMS:
            raise ConfigError("cp-comm", c, "one of " + ", ".join(CP_COMMS))
        if (
            caps.cp_comm and c not in caps.cp_comm and space.cp_comm != CP_COMMS
        ):  # a user's list, not the default
            raise ConfigError(
                "cp-comm", c, f"a key/value exchange {name} runs: " + ", ".join(caps.cp_comm)
            )
    for cp in space.cp or ():
        if not isinstance(cp, int) or cp < 1 or world % cp:
            raise ConfigError("cp", cp, f"a divisor of the world size {world}")
        if space.max_cp is not None and cp > space.max_cp:
            raise ConfigError("cp", cp, f"at most --max-cp {space.max_cp}")
        if cp > 1 and not caps.cp_comm:
            raise ConfigError("cp", cp, f"1: {name} has no context parallelism")
        if cp > 1 and mtp_without_pp_or_cp(framework, model):
            raise ConfigError(
                "cp",
                cp,
                f"1: {name} runs the model's multi-token-prediction modules without context "
                "parallelism",
            )
        comms = [c for c in space.cp_comm if c in caps.cp_comm] or ["p2p"]
        if cp > 1 and not any(
            cp_comm_allowed(c, cp=cp, tp=1, seq=seq, heads=heads, kv_heads=kv_heads) for c in comms
        ):
            ParallelConfig(
                cp=cp, placement=default_placement(cp), cp_comm=comms[0]
            ).check_sequence(  # its message
                seq, heads=heads, kv_heads=kv_heads
            )
    if space.dp_shard is not None:
        if (
            not isinstance(space.dp_shard, int)
            or space.dp_shard < 0
            or (space.dp_shard and world % space.dp_shard)
        ):
            raise ConfigError(
                "dp-shard",
                space.dp_shard,
                f"0 (all dp ranks) or a divisor of the world size {world}",
            )
        if space.dp_shard and not caps.hsdp:
            raise ConfigError(
                "dp-shard", space.dp_shard, f"0: {name} shards over all dp ranks only"
            )
    moe = getattr(model, "moe", None)
    for ep in space.ep or ():
        if not isinstance(ep, int) or ep < 1:
            raise ConfigError("ep", ep, "a positive integer")
        if space.max_ep is not None and ep > space.max_ep:
            raise ConfigError("ep", ep, f"at most --max-ep {space.max_ep}")
        if ep == 1:
            continue
        if moe is None:
            raise ConfigError(
                "ep",
                ep,
                f"1: {getattr(model, 'name', 'the model')} is dense (expert parallelism "
                "needs a mixture-of-experts model)",
            )
        if moe.experts % ep:
            raise ConfigError(
                "ep",
                ep,
                f"a divisor of the {moe.experts} experts: "
                + ", ".join(map(str, expert_parallel_degrees(dp=moe.experts, experts=moe.experts))),
            )
        if not caps.ep:
            raise ConfigError("ep", ep, f"1: {name} has no expert parallelism")
        if not ep_costed():
            raise ConfigError(
                "ep",
                ep,
                "1 until expert parallelism is costed (planner estimate refuses ep > 1 too)",
            )


def recommend(
    model,
    hardware,
    *,
    gpus: int | None = None,
    nodes: int | None = None,
    global_batch: int | None = None,
    seq: int | None = None,
    precision: str | None = None,
    optimizer: str = "adamw",
    objective: str = "throughput",
    top: int = 5,
    spot: bool = False,
    price_per_hour: float | None = None,
    tokens: float | None = None,
    space: SearchSpace = SearchSpace(),
    refine: int = REFINE_TOP,
    progress: Callable[[int, int], None] | None = None,
    score_fn=None,
    estimate_fn=None,
    framework: str = "megatron",
    options: RunOptions | None = None,
    reliability=None,
) -> Recommendation:
    """Search the parallel strategies of `model` on `gpus` devices of `hardware` and rank them.

    `model` is a MODEL argument (catalog name, config.json, factory) or a resolved spec; `hardware`
    a profile name, path or HardwareProfile; `framework` the software stack (frameworks/*.json): only
    plans it can run are searched (SearchSpace.for_framework), costed with its profile, run with
    `options` (planner.run_options.RunOptions; None or an unset field: the framework's default), which
    score() and every estimate() that refines a leader take whole. With `options.bf16_optimizer` only
    ZeRO-1 without optimizer offload is searched (what DeepSpeed's BF16_Optimizer runs); with the MoE
    exchange overlap only plans Megatron-Core runs it with: interleaved stages when pipelined, no full
    recomputation (TransformerConfig.overlap_moe_expert_parallel_comm).
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
    from frameworks.rules import check_moe_runnable

    options = options or RunOptions()
    software = software_for(framework, options)
    check_activation_fp8_input(software, model)
    precision = resolve_precision(
        hardware, precision
    )  # None: bf16 mixed precision where the device has bf16
    check_moe_options(model, precision, options)
    # what the stack cannot run whatever the degrees (the overlap's per-plan conditions restrict the space below)
    check_moe_runnable(
        software.framework,
        software,
        model,
        ParallelConfig(
            dp=2,
            ep=2,
            global_batch=2,
            placement="PDET",
            precision=precision,
            framework=software.framework.name,
        ),
    )
    check_master_weights(software, precision)
    ParallelConfig(
        precision=precision, optimizer=optimizer, framework=software.framework.name
    )  # validates them
    from frameworks.rules import violations

    problems = violations(
        software.framework, ParallelConfig(precision=precision, framework=software.framework.name)
    )
    if problems:
        raise ConfigError(
            "precision",
            precision,
            f"a precision {software.framework.name} runs",
            message=f"framework {software.framework.name} cannot run this plan: {problems[0]}",
        )
    seq = seq or model.seq
    check_space(space, model, software.framework, world=world, seq=seq)
    space = space.for_framework(software.framework, model)
    if software.bf16_optimizer:  # BF16_Optimizer shards like ZeRO-1 and runs its step on the device
        space = replace(
            space,
            zero=(1,),
            zero_with_pp=(1,),
            offload=tuple(o for o in space.offload if not offloads(o, "optimizer")),
        )
    held = {}
    if software.moe_a2a_overlap and model.moe is not None:
        # only plans frameworks.rules.a2a_overlap_conflict lets the overlap run on: interleaved stages when
        # pipelined, no full recomputation
        space = replace(
            space,
            schedules=tuple(s for s in space.schedules if s == "interleaved-1f1b"),
            recompute=tuple(r for r in space.recompute if r != "full"),
        )
        if not space.recompute:
            raise ConfigError(
                "moe_a2a_overlap",
                True,
                "false",
                message="moe_a2a_overlap cannot run with full recomputation, the only recompute the "
                "search may try (allowed with the overlap: recompute none or selective)",
            )
        held["full recompute"] = "moe_a2a_overlap"
    if software.bf16_optimizer:
        held.update({"ZeRO-3": "bf16_optimizer", "optimizer offload": "bf16_optimizer"})
    global_batch = global_batch or default_global_batch(world, seq, model_params(model))
    price = _price_per_hour(hardware, n_nodes, spot, price_per_hour)
    # the one rule (planner.option_rules), for the Python API as for the commands
    check_options(
        objective=objective, hardware=hardware.name, price=price, price_per_hour=price_per_hour
    )
    if estimate_fn is None:
        from planner.estimate import estimate as estimate_fn

    scored = score_space(
        model,
        hardware,
        world_size=world,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        space=space,
        score_fn=score_fn,
        objective=objective,
        keep=max(top, refine) + 1,
        software=software,
        progress=progress,
    )
    order = rank(scored, objective)
    if len(order) == 0 and np.any(scored.fits):
        raise non_finite_error(scored, hardware)
    if len(order) == 0:
        raise no_fit_error(
            scored,
            model=model,
            hardware=hardware,
            world_size=world,
            global_batch=global_batch,
            seq=seq,
            precision=precision,
            optimizer=optimizer,
            space=space,
            framework=software.framework.name,
            held=held,
        )

    kw = dict(
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        framework=software.framework.name,
    )
    leaders = [config_of(scored.arrays, int(i), **kw) for i in order[: max(top, refine) + 1]]
    documents, refined, splits = [], [0], {}

    def document(cfg: ParallelConfig, refine_it: bool) -> dict:
        """estimate()'s plan document of cfg; with refine_it, of its uneven split when that is better, and of
        full recomputation of fewer blocks per chunk when that fits and is better (fewest_recomputed_layers). The
        split does not depend on the placement (stage_problem reads none), so placement twins share one."""
        doc = split_document(cfg, refine_it)
        if refine_it and objective != "memory":
            plan = doc["plan"]
            best = replace(cfg, stages=tuple(plan["stages"]) if plan.get("stages") else cfg.stages)
            n = fewest_recomputed_layers(
                model,
                hardware,
                best,
                software=software,
                capacity=scored.capacity_bytes,
                score_fn=score_fn,
                global_batch=global_batch,
                seq=seq,
                precision=precision,
                optimizer=optimizer,
            )
            if n is not None:
                refined[0] += 1
                fewer = estimate_fn(
                    model, hardware, replace(best, recompute_layers=n), gpus=world, options=options
                ).to_document()
                if fewer["prediction"]["memory"]["fits"] and _objective_value(
                    fewer, objective
                ) < _objective_value(doc, objective):
                    return fewer
        return doc

    def split_document(cfg: ParallelConfig, refine_it: bool) -> dict:
        """estimate()'s plan document of cfg; with refine_it, of its uneven split when that is better."""
        doc = estimate_fn(model, hardware, cfg, gpus=world, options=options).to_document()
        if refine_it and cfg.pp > 1 and software.framework.capabilities.uneven_stages:
            twin = tuple(
                (k, tuple(v) if isinstance(v, list) else v)
                for k, v in cfg.to_dict().items()
                if k != "placement"
            )
            stages = (
                splits[twin]
                if twin in splits
                else splits.setdefault(twin, uneven_stages(model, cfg, software))
            )
            if stages:
                refined[0] += 1
                uneven = estimate_fn(
                    model, hardware, replace(cfg, stages=stages), gpus=world, options=options
                ).to_document()
                if uneven["prediction"]["memory"]["fits"] and _objective_value(
                    uneven, objective
                ) < _objective_value(doc, objective):
                    return uneven
        return doc

    for position, cfg in enumerate(leaders):
        documents.append(document(cfg, position < refine))
    documented = list(zip(order[: len(leaders)], documents))
    documents = [d for d in documents if d["prediction"]["memory"]["fits"]] or documents
    documents = [_with_cost(d, price, spot, tokens, hardware, reliability) for d in documents]
    documents.sort(key=lambda d: _objective_value(d, objective))
    documents = with_bands(documents[:top])

    versus = _cp_versus(
        scored,
        objective,
        documents[0],
        lambda i: document(config_of(scored.arrays, i, **kw), refine > 0),
    )
    ep_versus = _ep_versus(
        scored,
        objective,
        model,
        hardware,
        software,
        documented,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
    )
    stats = replace(
        scored.stats,
        seconds=time.perf_counter() - t0,
        refined=refined[0],
        held=held_dimensions(software.framework, model),
    )
    best = dict(documents[0])
    best["alternatives"] = [key_numbers(d) for d in documents[1:]]
    best["search"] = {
        "objective": objective,
        "candidates_evaluated": stats.candidates_evaluated,
        "feasible": stats.feasible,
        "seconds": round(stats.seconds, 4),
        "values_tried": {k: list(v) for k, v in stats.values_tried.items()},
        "cp_versus": versus,
        **({"held": dict(stats.held)} if stats.held else {}),
        **({"ep_versus": ep_versus} if ep_versus is not None else {}),
    }
    ties = ties_of(documents, objective)
    if ties is not None:
        best["search"]["near_ties"] = ties
    return Recommendation(
        objective=objective,
        best=best,
        alternatives=tuple(documents[1:]),
        stats=stats,
        scored=scored,
    )
