"""What a search returns: its statistics, every scored candidate (ScoredSpace) ranked by the
objective, and the Recommendation (plan documents of the winner and the runners-up)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from planner.candidates import placement_text
from planner.parallel import CP_COMMS, OFFLOAD, RECOMPUTE, SCHEDULES
from planner.placement import PLACEMENTS
from planner.errors import ConfigError
from planner.search.space import MEMORY_OBJECTIVE_SLACK, OBJECTIVES


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
    near_misses_resplit: int = 0
    """Plans whose even split misses the memory re-split under a memory cap (search.near_miss)."""
    near_misses_fit: int = 0
    """Of those, the plans that then fit and joined the ranking with their uneven stages."""
    rejected: Mapping[str, int] = field(default_factory=dict)
    """Combinations outside the rules, by reason."""
    values_tried: Mapping[str, list] = field(default_factory=dict)
    """Distinct cp, cp_comm, dp_shard and ep values the rules admitted (search.values_tried)."""
    held: Mapping[str, str] = field(default_factory=dict)
    """Dimensions the framework holds at 1 for this model, each with why (search.held_dimensions)."""
    free_overlaps: tuple[str, ...] = ()
    """Overlap options the search chose per plan (planner.software.free_overlaps)."""
    turned_on: tuple[str, ...] = ()
    """Of those, the ones the best plan runs (its software block has them on)."""

    def overlaps(self) -> dict:
        """The `overlaps` entry of the search blocks: {} when no overlap was the search's choice."""
        if not self.free_overlaps:
            return {}
        return {"overlaps": {"free": list(self.free_overlaps), "turned_on": list(self.turned_on)}}

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
            "near_misses_resplit": self.near_misses_resplit,
            "near_misses_fit": self.near_misses_fit,
            "rejected": dict(self.rejected),
            "values_tried": {k: list(v) for k, v in self.values_tried.items()},
            **({"held": dict(self.held)} if self.held else {}),
            **self.overlaps(),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSummary:
    """The `search` section of the winner's plan document: what `explain` reads of the search."""

    objective: str
    stats: SearchStats
    cp_versus: Mapping[str, Any] | None = None
    """The best plan of the other cp class (planner.search.documents._cp_versus)."""
    ep_versus: Mapping[str, Any] | None = None
    """The best plan of each expert-parallel class (planner.search.documents._ep_versus)."""
    near_ties: Mapping[str, Any] | None = None
    """The plans within the model's error of the fastest (planner.uncertainty.ties_of)."""

    def to_dict(self) -> dict:
        stats = self.stats
        return {
            "objective": self.objective,
            "candidates_evaluated": stats.candidates_evaluated,
            "feasible": stats.feasible,
            "seconds": round(stats.seconds, 4),
            "values_tried": {k: list(v) for k, v in stats.values_tried.items()},
            "cp_versus": self.cp_versus,
            **({"held": dict(stats.held)} if stats.held else {}),
            **stats.overlaps(),
            **({"ep_versus": self.ep_versus} if self.ep_versus is not None else {}),
            **({"near_ties": self.near_ties} if self.near_ties is not None else {}),
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


@dataclass(frozen=True, kw_only=True, slots=True)
class NearMisses:
    """What the re-splitting of the near-miss plans gave."""

    documents: tuple[dict, ...] = ()
    """estimate()'s plan documents of the re-split plans that fit, with their uneven `stages`."""
    rows: tuple[int, ...] = ()
    """Each document's row in the scored arrays (its even-split twin)."""
    resplit: int = 0
    """Near-miss plans re-split under a memory cap (SearchStats.near_misses_resplit)."""
    closest: dict | None = None
    """Of the splits that still missed, the one that needs least (what the no-fit message cites)."""

    @property
    def fit(self) -> int:
        return len(self.documents)


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
