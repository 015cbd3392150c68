"""recommend(): check and resolve the request, search the space, refine and document the leaders,
and rank the documents."""

from __future__ import annotations

import time
from dataclasses import replace

from planner.search.bounds import Admission
from planner.search.branch_and_bound import score_space
from planner.search.documents import _cp_versus, _ep_versus, key_numbers, ranked_documents
from planner.search.near_miss import entry_threshold_s, near_misses
from planner.search.no_fit import unranked_error
from planner.search.overlaps import FreeOverlapScorer, search_scoring, settled, turned_on
from planner.search.refine import Refiner
from planner.search.request import SearchRequest, prepare
from planner.search.results import Recommendation, SearchSummary, rank
from planner.search.space import held_dimensions
from planner.uncertainty import ranked_by_preference, ties_of


def recommend(model, hardware, request: SearchRequest | None = None, **fields) -> Recommendation:
    """Search the parallel strategies of `model` on `gpus` devices of `hardware` and rank them.

    `model` is a MODEL argument (catalog name, config.json, factory) or a resolved spec; `hardware`
    a profile name, path or HardwareProfile; the rest a SearchRequest or its fields by name (`gpus`,
    `objective`, `framework`, `options`, `tokens`, `prefer`, ...: see SearchRequest). Only plans the
    framework can run with the run options are searched (SearchSpace.for_framework, space.narrowed);
    with `tokens` every plan document carries its goodput under failures (planner.goodput). Among
    plans within the model's measured error of the fastest, the one to prefer comes first
    (planner.uncertainty; `prefer='fastest'` keeps the predicted order). Raises ConfigError for bad
    input, NoFitError when no candidate fits in memory.
    """
    t0 = time.perf_counter()
    request = replace(request or SearchRequest(), **fields)
    setup = prepare(model, hardware, request)
    software, score_fn = search_scoring(setup, request.score_fn)
    scored = score_space(
        setup.model,
        setup.hardware,
        setup.workload,
        space=setup.space,
        software=software,
        score_fn=score_fn,
        progress=request.progress,
        admission=Admission(objective=request.objective, keep=request.leaders),
    )
    scored = settled(scored, setup, score_fn)
    order = rank(scored, request.objective)
    refiner = Refiner(setup, scored.capacity_bytes)
    threshold = entry_threshold_s(scored, order, request.objective, request.leaders)
    near = near_misses(scored, setup, refiner, threshold)
    if len(order) == 0 and not near.documents:
        raise unranked_error(scored, setup, near)
    leaders = [setup.workload.config(scored.arrays, int(i)) for i in order[: request.leaders]]
    documents = [refiner.document(cfg, n < request.refine) for n, cfg in enumerate(leaders)]
    documented = list(zip(order[: len(leaders)], documents)) + list(zip(near.rows, near.documents))
    documents += near.documents
    ranked = ranked_documents(documents, setup)
    ties = ties_of(ranked, request.objective)
    documents, ties = ranked_by_preference(ranked, ties, request.prefer)
    searched = (software, score_fn)
    summary = _summary(setup, scored, searched, (refiner, near), documents, documented, ties)
    summary = replace(summary, stats=replace(summary.stats, seconds=time.perf_counter() - t0))
    alternatives = [key_numbers(d) for d in documents[1:]]
    best = {**documents[0], "alternatives": alternatives, "search": summary.to_dict()}
    return Recommendation(
        objective=request.objective,
        best=best,
        alternatives=tuple(documents[1:]),
        stats=summary.stats,
        scored=scored,
    )


def _summary(setup, scored, searched, refined, documents, documented, ties) -> SearchSummary:
    """The winner's `search` section: why its cp and ep classes (against the best plan of each
    other class), the search's statistics (with the leaders refined and the near-miss plans
    re-split: planner.search.near_miss), the overlaps it turned on and the near-ties."""
    request, workload = setup.request, setup.workload
    refiner, near = refined
    software, score_fn = searched  # what the search scored with (planner.search.overlaps)
    versus = _cp_versus(
        scored,
        request.objective,
        documents[0],
        lambda i: refiner.document(workload.config(scored.arrays, i), request.refine > 0),
    )
    ep_versus = _ep_versus(
        scored,
        request.objective,
        setup.model,
        setup.hardware,
        software,
        documented,
        workload,
        fallback=score_fn.off if isinstance(score_fn, FreeOverlapScorer) else None,
    )
    stats = replace(
        scored.stats,
        refined=refiner.refined,
        near_misses_resplit=near.resplit,
        near_misses_fit=near.fit,
        held=held_dimensions(setup.software.framework, setup.model),
        free_overlaps=setup.free_overlaps,
        turned_on=tuple(turned_on(documents[0], setup.free_overlaps)),
    )
    return SearchSummary(
        objective=request.objective,
        stats=stats,
        cp_versus=versus,
        ep_versus=ep_versus,
        near_ties=ties,
    )
