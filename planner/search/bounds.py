"""The scorer the search calls on arrays of candidates, the lower-bound terms it reads of the scores
(TIME_BOUND_TERMS, SHAPE_BOUND_TERMS), the admission thresholds, and the placement classes whose
shape terms are equal (the premises are checked in tests/test_search_bounds.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

import planner.score as score_module
from cost_models.moe import EP_LINKS, ep_links
from planner.candidates import FIELDS
from planner.placement import PLACEMENTS, group_locality
from planner.search.space import MEMORY_OBJECTIVE_SLACK


SCORE_CHUNK = 16_384
"""Candidates scored per call (one progress tick each). Small enough that the scorer's temporary arrays
(128 KiB of float64 each) stay in the CPU caches and are reused from the allocator's heap: with 262,144 the
2 MiB temporaries were fresh pages each call (page faults: ~0.3 s of system time of a 1.8 s DeepSeek-V3
search on 2,048 GPUs); the per-call overhead of score() is small beside that. Rows are scored independently,
so the chunk never changes a score."""


TIME_BOUND_TERMS = (
    "compute",
    "tp_comm",
    "cp_comm",
    "bubble_bound",
    "pp_p2p_bound",
    "dp_bound",
    "optimizer",
)
"""Step-time terms of planner.score that are least, within a group (a row with a placement and a
sequence-parallel choice), for the weakest recompute, and whose sum never exceeds the step (checked
in tests/test_search.py) nor the simulated step that estimate() documents the leaders with
(cost_models.timeline; tests/test_timeline.py): compute, tp_comm and cp_comm are m x the slowest
stage but its exposed expert-parallel time (ep_comm: left out, so that each expert-parallel class
keeps a scored plan for the explanation to compare, planner.search.documents._ep_versus; its lower
part EP_BOUND_TERM proves candidates out against their class's best step); the pipeline's idle time
and sends, and the data-parallel time after the compute, enter as the lower bounds both steps share
(Scores.bubble_bound, Scores.pp_p2p_bound, Scores.dp_bound; planner.score._pipeline_bounds), not as
the closed form's: the longest of some chains of operations the simulated step runs one after the
other, each term never above the closed form's. Offload time is left out: more recompute can hide
it."""


EP_BOUND_TERM = "ep_bound"
"""The expert-parallel time every step of a candidate runs (Scores.ep_bound, never above ep_comm),
left out of TIME_BOUND_TERMS: it proves a candidate out only against its expert-parallel class's
best known step as well as the admission threshold (`_ep_thresholds`), so that each class that
planner.search.documents._ep_versus compares keeps the same fastest scored plan. Like the shape
terms it does not depend on the model-state knobs or the placement within a class (with ep > 1 each
placement is its own class), it is never less with sequence parallelism off, and it never falls
from one recompute level to the next, nor does the bound with it (checked in
tests/test_search_bounds.py): one evaluation per shape bounds the shape's candidates."""


SHAPE_BOUND_TERMS = ("compute", "tp_comm", "cp_comm", "bubble_bound")
"""The TIME_BOUND_TERMS that do not depend on the model-state knobs (ZeRO stage, dp_shard, offload): one
evaluation bounds every candidate of a shape (checked in tests/test_search_bounds.py). (dp_bound
reads the ZeRO stage and shard group: a group term, like pp_p2p_bound and optimizer.)"""


SP_OFF_FLOOR_TERM = "sp_off_floor"
"""Scores.sp_off_floor: what compute + tp_comm of the twin of a candidate with sequence
parallelism off never go below (the search scores that twin only where it could be admitted)."""


_READ_TERMS = TIME_BOUND_TERMS + (EP_BOUND_TERM, SP_OFF_FLOOR_TERM)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Admission:
    """What may enter a search's result: the objective and how many leaders it keeps (the admission
    threshold is the `keep`-th best feasible step; _admission_threshold), and the two bounds, which a
    test switches off to score every candidate."""

    objective: str = "throughput"
    keep: int = 10
    prune: bool = True
    """Drop a member with sequence parallelism off whose twin with it on does not fit."""
    time_bound: bool = True
    """Prove out the candidates whose time bound reaches the admission threshold."""


@dataclass(frozen=True, slots=True)
class _Scores:
    """What the search reads of planner.score.Scores for a batch of candidates."""

    step: np.ndarray
    peak: np.ndarray
    needed: np.ndarray
    """What decides fitting (Scores.needed_bytes: the peak with the allocator's overhead and the CUDA
    context; the peak itself where a scorer handed in by a test reports no more)."""
    terms: Mapping[str, np.ndarray]
    """Each of TIME_BOUND_TERMS and EP_BOUND_TERM (zeros where the scorer reports no such term)."""

    @property
    def bound(self) -> np.ndarray:
        """Sum of TIME_BOUND_TERMS: no step is shorter, and a group's first has the least."""
        return sum(self.terms[t] for t in TIME_BOUND_TERMS)

    @property
    def shape_bound(self) -> np.ndarray:
        """Sum of SHAPE_BOUND_TERMS: the same for every candidate of a shape at the weakest recompute."""
        return sum(self.terms[t] for t in SHAPE_BOUND_TERMS)

    @property
    def ep(self) -> np.ndarray:
        """EP_BOUND_TERM (zeros where the scorer reports no such term)."""
        return self.terms.get(EP_BOUND_TERM, np.zeros(len(self.step)))

    @classmethod
    def empty(cls) -> "_Scores":
        return cls(np.zeros(0), np.zeros(0), np.zeros(0), {t: np.zeros(0) for t in _READ_TERMS})


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
        self.score_fn = score_fn or score_module.score  # looked up here: a test patches it
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
        terms = {t: np.zeros(n) for t in _READ_TERMS}
        for start in range(0, n, SCORE_CHUNK):
            chunk = {k: v[start : start + SCORE_CHUNK] for k, v in arrays.items()}
            scores = self.score_fn(self.model, self.hardware, _candidate_arrays(chunk), **self.kw)
            part = slice(start, start + SCORE_CHUNK)
            step[part] = np.asarray(scores.step_time_s, dtype=float)
            peak[part] = np.asarray(scores.peak_bytes_per_gpu, dtype=float)
            needed[part] = np.asarray(
                getattr(scores, "needed_bytes", scores.peak_bytes_per_gpu), dtype=float
            )
            for term in _READ_TERMS:
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


def _ep_thresholds(thresholds: np.ndarray, ep_best: np.ndarray) -> np.ndarray:
    """Admission thresholds for a bound that adds EP_BOUND_TERM: each candidate's (`thresholds`) raised
    to its expert-parallel class's best feasible step scored so far (`ep_best`; infinite while none is
    known). A candidate whose bound reaches it is slower than a scored plan of its own class, so it is
    neither a leader nor its class's fastest scored plan, and the thresholds and each class's best
    evolve as if it were scored (it would change neither)."""
    return np.maximum(thresholds, ep_best * (1 + 1e-12))


def ep_classes(arrays: Mapping[str, np.ndarray], nvlink_domain: int) -> np.ndarray:
    """Each candidate's expert-parallel class as planner.search.documents._ep_versus groups them: its
    ep degree and where its all-to-all runs (cost_models.moe.EP_LINKS), as one integer."""
    local = group_locality(
        arrays["placement"],
        arrays["dp"],
        arrays["pp"],
        arrays["tp"],
        nvlink_domain,
        cp=arrays["cp"],
        ep=arrays["ep"],
    )["E"]
    return np.asarray(arrays["ep"]) * len(EP_LINKS) + ep_links(arrays["ep"], local)


def _candidate_arrays(arrays: Mapping[str, np.ndarray]):
    return score_module.CandidateArrays(**{k: np.asarray(arrays[k]) for k in FIELDS})


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
