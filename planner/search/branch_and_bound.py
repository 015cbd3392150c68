"""Best-first branch and bound over shapes (planner.search's docstring): every valid candidate scored
by the vectorized cost model or proven out by a time or memory bound (score_space)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable

import numpy as np

from planner.candidates import (
    FIELDS,
    SearchSpace,
    _pattern_groups,
    _product,
    leanest,
    skeleton_rows,
    with_micro_batches,
)
from planner.errors import ConfigError
from planner.parallel import RECOMPUTE, offload_indices
from planner.placement import PLACEMENTS, packed_key
from planner.search.bounds import (
    SHAPE_FIELDS,
    SP_OFF_FLOOR_TERM,
    Admission,
    _class_thresholds,
    _ep_thresholds,
    _Scorer,
    _Scores,
    _ranges,
    ep_classes,
    placement_classes,
)
from planner.search.results import ScoredSpace, SearchStats
from planner.search.space import (
    Workload,
    _costed,
    _model_shape,
    _no_space_reason,
    _take,
    values_tried,
)


def score_space(
    model,
    hardware,
    workload: Workload,
    *,
    space: SearchSpace = SearchSpace(),
    software=None,
    score_fn=None,
    progress: Callable[[int, int], None] | None = None,
    admission: Admission = Admission(),
) -> ScoredSpace:
    """Generate, bound and score the whole space (module docstring); no ranking yet."""
    t0 = time.perf_counter()
    world_size, global_batch, seq = workload.world_size, workload.global_batch, workload.seq
    heads, kv_heads, blocks = _model_shape(model)
    rejected: Counter = Counter()
    scorer = _Scorer(
        model,
        hardware,
        **workload.score_kw(),
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
        objective=admission.objective,
        keep=admission.keep,
        prune=admission.prune,
        time_bound=admission.time_bound,
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
    model-state knobs, the shape terms not on the placement within a class; the optimizer step
    depends on the skeleton only; sequence parallelism on never needs more memory than off; the
    placement moves no memory.

    So one evaluation per shape (its representative's first, with sequence parallelism on where tp >
    1), and for a shape holding both choices about to be proven out a second with it off (the lesser
    bounds the shape, `_admissible`), bounds from below every candidate of the shape. Shapes are
    expanded in growing batches -- those whose representative fits and is fast first, so that the
    admission threshold falls soon -- while their bound is below the threshold (which only falls as
    feasible candidates are found); the others are proven out. Expanding shapes scores the
    representative row's groups (each placement and sequence-parallel choice) and one group of every
    skeleton not seen yet (giving each group's shape terms, p2p and optimizer terms), then the
    firsts of the other groups whose shape terms + p2p + optimizer are below the threshold, then
    each stronger recompute level of the groups whose previous level's bound is below it, except
    members with sequence parallelism off whose twin with it on (same row and level, any placement)
    was scored and does not fit.

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
        shape holds both sequence-parallel choices (`_admissible` bounds it)."""
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
        # the placement each class's representative takes: its first
        self.first_place = np.array([c[0] for c in self.class_places], dtype=np.int64)
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
        self, row: np.ndarray, place: np.ndarray, sp: np.ndarray, levels, shape=None
    ) -> dict[str, np.ndarray]:
        """Rows with a placement and sequence-parallel choice each, at one recompute level or at each of
        `levels`; with `shape`, the shape each belongs to."""
        out = {
            k: self.rows[k][row]
            for k in FIELDS
            if k not in ("placement", "sequence_parallel", "recompute")
        }
        out["placement"], out["sequence_parallel"], out["row"] = place, sp, row
        if shape is not None:
            out["shape"] = shape
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

    def _below(self, bound: np.ndarray, members, ep: np.ndarray | None = None) -> np.ndarray:
        """Which candidates (of the shapes `members["shape"]`, bound `bound`) may still enter the result
        or be their expert-parallel class's fastest: the bound below the admission threshold, and the
        bound plus their expert-parallel time (`ep`, scored; else their shape's, which is no more)
        below that threshold raised to the class's best scored step (`_ep_thresholds`)."""
        thr = self._threshold_of(members)
        if not self.ep_on:  # a dense model, or no expert-parallel time in the space
            return bound < thr
        shape = members["shape"]
        ep = self.shape_ep[shape] if ep is None else ep
        ep_thr = _ep_thresholds(thr, self.ep_best[self.shape_ep_class[shape]])
        return (bound < thr) & (bound + ep < ep_thr)

    def _score(self, members) -> _Scores:
        if not len(members["dp"]):
            return _Scores.empty()
        arrays = {k: members[k] for k in FIELDS}
        r = self.scorer(arrays, self._tick)
        self.parts.append((arrays, r.step, r.peak, r.needed))
        ok = (r.needed <= self.capacity) & np.isfinite(r.step)
        self.feasible_steps.append(r.step[ok])
        self.feasible_cls.append(np.asarray(arrays["cp"])[ok] > 1)
        np.minimum.at(self.ep_best, self.shape_ep_class[members["shape"][ok]], r.step[ok])
        on = np.asarray(members["sequence_parallel"], bool)
        self.needed_on[members["row"][on], members["recompute"][on]] = r.needed[on]
        return r

    def run(self) -> None:
        reps = self._members(
            self.starts[self.shape_run],
            self.first_place[self.shape_class] if self.n_shapes else np.zeros(0, dtype=np.int64),
            self.shape_sp,
            self.weakest,
        )
        r = self.scorer({k: reps[k] for k in FIELDS}) if self.n_shapes else _Scores.empty()
        self.bound_evaluations += self.n_shapes
        self._ep_terms(reps, r.ep)
        ok = (r.needed <= self.capacity) & np.isfinite(r.step)
        self.rep_step = np.where(
            ok, r.step, np.inf
        )  # the representatives' firsts: known feasible steps
        self.expanded = np.zeros(self.n_shapes, bool)
        lb = self.shape_lb = np.array(r.shape_bound, dtype=float)
        # what each shape's twin with sequence parallelism off never goes below (_admissible)
        # 0 where the scorer reports no floor: every twin is scored
        self.shape_floor_off = r.terms.get(SP_OFF_FLOOR_TERM, np.zeros(self.n_shapes))
        both = np.array([len(c) > 1 for c in self.sp_choices], dtype=bool)
        self.twin_pending = both[self.shape_sps] if self.n_shapes else np.zeros(0, dtype=bool)
        # expand first the shapes whose representative fits and is fast (the threshold falls soonest), then
        # the others by their bound; the order only sets how soon the threshold falls, never what is proven
        order = np.lexsort((lb, self.rep_step))
        batch = self.FIRST_BATCH
        while len(order):
            order = self._admissible(order)
            take, order = order[:batch], order[batch:]
            if len(take):
                self._expand(take)
            batch *= self.BATCH_GROWTH

    def _admissible(self, shapes: np.ndarray) -> np.ndarray:
        """The shapes whose bound is below the admission threshold; the others are proven out. A
        shape about to be proven out that holds both sequence-parallel choices first takes the
        lesser of its two representatives' bounds (a stack whose backward runs its tensor-parallel
        collectives beside its GEMMs can expose less with sequence parallelism off,
        cost_models.comm._async_backward; the one with it on is scored first). That twin is scored
        only where it could still be admitted: its compute + tensor-parallel time is never less than
        the representative's Scores.sp_off_floor, its other bound terms are not negative, its
        expert-parallel time is never less than with sequence parallelism on
        (tests/test_search_bounds.py), and the threshold only falls."""

        def below(bound, at):
            return self._below(bound, {"cp": 1 + self.cls[at], "shape": at})

        ok = below(self.shape_lb[shapes], shapes)
        twins = shapes[~ok & self.twin_pending[shapes]]
        if len(twins):
            self.twin_pending[twins] = False
            twins = twins[below(self.shape_floor_off[twins], twins)]
        if len(twins):
            self.shape_lb[twins] = np.minimum(self.shape_lb[twins], self._twin_bounds(twins))
            ok = below(self.shape_lb[shapes], shapes)
        return shapes[ok]

    def _twin_bounds(self, shapes: np.ndarray) -> np.ndarray:
        """The shape terms of these shapes' representatives with sequence parallelism off."""
        off = self._members(
            self.starts[self.shape_run[shapes]],
            self.first_place[self.shape_class[shapes]],
            np.zeros(len(shapes), dtype=bool),
            self.weakest,
        )
        self.bound_evaluations += len(shapes)
        return self.scorer({k: off[k] for k in FIELDS}).shape_bound

    def _ep_terms(self, reps, ep_bound: np.ndarray) -> None:
        """Each shape's expert-parallel time (EP_BOUND_TERM of its representative, which bounds every
        candidate of the shape from below) and class (`ep_classes`: with ep > 1 a shape has one
        placement), and no class's best step known yet."""
        self.shape_ep = ep_bound
        self.shape_ep_class = np.zeros(self.n_shapes, dtype=np.int64)
        domain = getattr(self.scorer.hardware, "nvlink_domain_devices", None)
        self.ep_on = bool(domain and np.any(ep_bound > 0))
        if self.ep_on:
            keys = ep_classes(reps, domain)
            self.shape_ep_class = np.unique(keys, return_inverse=True)[1].reshape(-1)
        self.ep_best = np.full(int(self.shape_ep_class.max(initial=0)) + 1, np.inf)

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
        members = self._members(row[probe], place[probe], sp[probe], self.weakest, shape[probe])
        r = self._score(members)
        self.optimizer_s[skeleton[probe]] = r.terms["optimizer"]
        live_parts = [probe[self._below(r.bound, members, r.ep)]]
        p2p_key = (shape * len(PLACEMENTS) + place) * 2 + sp
        known = p2p_key[probe][rep[probe]]
        order = np.argsort(known)
        rest = np.setdiff1d(np.arange(len(row)), probe, assume_unique=True)
        at = np.clip(np.searchsorted(known[order], p2p_key[rest]), 0, max(len(known) - 1, 0))
        # the shape terms and p2p of each rest's shape, placement and sequence-parallel choice, read
        # off the representative row's group with the same ones (the shape terms are the same for
        # every row of a shape and placement of its class, the p2p for every row)
        p2p, terms = (
            (r.terms["pp_p2p_bound"][rep[probe]][order][at], r.shape_bound[rep[probe]][order][at])
            if len(known)
            else (np.zeros(len(rest)), np.zeros(len(rest)))
        )
        lb = terms + p2p + self.optimizer_s[skeleton[rest]]
        rest = rest[self._below(lb, {"cp": self.rows["cp"][row[rest]], "shape": shape[rest]})]
        if len(rest):
            members = self._members(row[rest], place[rest], sp[rest], self.weakest, shape[rest])
            r = self._score(members)
            live_parts.append(rest[self._below(r.bound, members, r.ep)])
        live = np.concatenate(live_parts) if live_parts else np.zeros(0, dtype=np.int64)
        self._levels(row[live], place[live], sp[live], shape[live])

    def _levels(self, row, place, sp, shape) -> None:
        """Score each stronger recompute level of the live groups (class docstring)."""
        for level in sorted(self.levels)[1:]:
            # a stronger level only where the previous one's bound (for a member skipped for memory, the last
            # bound known) is below the threshold: the bound grows along RECOMPUTE
            if not len(row):
                return
            on = self._members(row[sp], place[sp], sp[sp], level, shape[sp])  # sp on first
            r_on = self._score(on)
            off_at = np.flatnonzero(~sp)
            twin_needed = self.needed_on[row[off_at], level]  # NaN: the twin is not scored (yet)
            skip = twin_needed > self.capacity if self.prune else np.zeros(len(off_at), bool)
            self.pruned_memory += int(skip.sum())
            at = off_at[~skip]
            off = self._members(row[at], place[at], sp[at], level, shape[at])
            r_off = self._score(off)
            keep = np.ones(len(row), bool)
            keep[np.flatnonzero(sp)] = self._below(r_on.bound, on, r_on.ep)
            keep[at] = self._below(r_off.bound, off, r_off.ep)
            row, place, sp, shape = row[keep], place[keep], sp[keep], shape[keep]

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
