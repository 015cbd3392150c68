"""The overlap options the search chooses per plan (planner.software.free_overlaps): the ones the
user left unset that the framework runs but leaves off by default.

The choice, for each plan: on where the plan can run it (planner.software.plan_options) unless
then the plan does not fit. tp_comm_overlap never makes a plan slower (cost_models.comm.
tp_exposed_parts: per pass max(0, C - G) + i min(C, G) <= C) and costs only memory (its
userbuffers, cost_models.memory.userbuffer_bytes), so that rule gives each plan its best value and
the search stays exact: a plan is scored with the overlap on; a row that then misses the memory
but fits without the userbuffers (what it needs without them is exact: they are held at every
moment on every rank) enters the search with that memory and an unknown step, never a feasible
step for the admission thresholds (which only stay higher), and is scored with the overlap off in
one call when the search ends (FreeOverlapScorer.settle). The lower-bound terms
(planner.search.bounds.TIME_BOUND_TERMS) are kept from the scores with it on, which are never above
either choice's step and keep the bound's premises (one software for every candidate); a plan with
sequence parallelism still never needs more memory than its twin without it (which runs no
overlap)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

import numpy as np

import planner.score as score_module
from cost_models.memory import fits, needed_bytes, userbuffer_bytes
from planner.software import MEMORY_OVERLAPS


class FreeOverlapScorer:
    """A score function (planner.score.score's signature) that scores each candidate with the free
    overlaps on; a candidate that then misses the memory but fits without the overlap's buffers is
    returned as it needs without them and with an unknown (infinite) step, and `settle` scores
    those rows with the overlaps off once the search ends, in one call (module docstring)."""

    def __init__(self, base, on, off):
        self.base = base or score_module.score  # looked up here: a test patches it
        self.on, self.off = on, off

    def __call__(self, model, hw, cands, *, software=None, **kw):
        s = self.base(model, hw, cands, software=self.on, **kw)
        if not is_dataclass(s) or not hasattr(s, "needed_bytes"):
            return s
        cands = score_module.CandidateArrays.from_mapping(_as_mapping(cands))
        buffers = userbuffer_bytes(
            self.on,
            model,
            kw.get("precision", "amp-bf16"),
            micro_batch=cands.micro_batch,
            seq=kw["seq"],
            cp=1 if cands.cp is None else cands.cp,
            tp=cands.tp,
            sequence_parallel=cands.sequence_parallel,
        )
        peak = np.asarray(s.peak_bytes_per_gpu) - buffers
        fits_without = fits(peak, hw, self.off)  # the one definition (cost_models.memory.fits)
        off = (buffers > 0) & ~np.asarray(s.fits, dtype=bool) & fits_without
        if not off.any():
            return s
        # what the plan needs without the buffers is exact (they are held at every moment on every
        # rank); its step is scored by `settle`: unknown to the bounds until then (never counted as
        # a feasible step, so the admission threshold stays above the true one)
        return replace(
            s,
            step_time_s=np.where(off, np.inf, s.step_time_s),
            peak_bytes_per_gpu=np.where(off, peak, s.peak_bytes_per_gpu),
            needed_bytes=np.where(off, needed_bytes(peak, hw, self.off), s.needed_bytes),
            fits=np.where(off, fits_without, s.fits),
        )

    def settle(self, scored, model, hw, score_kw: dict):
        """`scored` (planner.search.results.ScoredSpace) with the rows left unknown scored with the
        overlaps off."""
        rows = np.flatnonzero(
            np.isinf(scored.step_time_s) & (scored.needed_bytes <= scored.capacity_bytes)
        )
        if not len(rows):
            return scored
        cands = _rows(scored.arrays, rows)
        s = self.base(model, hw, cands, software=self.off, **score_kw)
        out = {}
        for name in ("step_time_s", "peak_bytes_per_gpu", "needed_bytes"):
            value = np.array(getattr(scored, name), dtype=float, copy=True)
            value[rows] = np.asarray(getattr(s, name), dtype=float)
            out[name] = value
        return replace(scored, **out)


def _as_mapping(cands) -> dict:
    if isinstance(cands, score_module.CandidateArrays):
        values = {f.name: getattr(cands, f.name) for f in fields(cands)}
        return {k: v for k, v in values.items() if v is not None}
    return dict(cands)


def _rows(cands, rows: np.ndarray):
    """Candidates `rows` of `cands` (CandidateArrays)."""
    return score_module.CandidateArrays.from_mapping(
        {k: np.asarray(v)[rows] for k, v in _as_mapping(cands).items()}
    )


def settled(scored, setup, score_fn):
    """The search's result with the rows the FreeOverlapScorer left unknown scored (`settle`)."""
    if not isinstance(score_fn, FreeOverlapScorer):
        return scored
    return score_fn.settle(scored, setup.model, setup.hardware, setup.workload.score_kw())


def search_scoring(setup, score_fn=None):
    """(software, score_fn) the search scores with: the request's when no overlap is free, else the
    software with the free overlaps on (each costed only on the rows that run it) and, when one
    costs memory (planner.software.MEMORY_OVERLAPS), a FreeOverlapScorer whose `off` keeps the
    others on."""
    if not setup.free_overlaps:
        return setup.software, score_fn
    on = replace(setup.software, **{name: True for name in setup.free_overlaps})
    if not any(name in MEMORY_OVERLAPS for name in setup.free_overlaps):
        return on, score_fn
    kept = {name: True for name in setup.free_overlaps if name not in MEMORY_OVERLAPS}
    return on, FreeOverlapScorer(score_fn, on, replace(setup.software, **kept))


def turned_on(document, free: tuple[str, ...]) -> list[str]:
    """Of the free overlaps, those a plan document's software block has on."""
    software = document.get("software") or {}
    return [name for name in free if software.get(name)]
