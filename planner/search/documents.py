"""Plan documents of the leaders: cost and goodput figures, the key numbers of a runner-up, the
objective's order of documents, and why the winner's cp and ep classes (cp_versus, ep_versus)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

import planner.estimate as estimate_module  # its STEP_MODEL is read at call time
from planner.candidates import FIELDS
from planner.goodput import reliability_figures, with_reliability
from planner.search.bounds import _candidate_arrays
from planner.search.results import ScoredSpace, rank
from planner.search.request import Setup
from planner.search.space import Workload, config_of
from planner.uncertainty import with_bands
from planner.estimate import Estimate, even_stages
from planner.placement import group_locality
from planner.score import score
from cost_models.compute import block_seconds
from cost_models.moe import EP_LINKS, ep_links, placement_summary
from cost_models.step import Step


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
    workload: Workload,
    fallback=None,
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
    for a dense model or a search with one class. Under the memory objective the classes' fastest plans.
    `software` is the search's (the free overlaps on), `fallback` the run's where they differ
    (`_as_scored_entries`)."""

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
        for n, entry in enumerate(
            _as_scored_entries(model, hardware, rows, software, fallback, workload)
        ):
            entries[int(cls[plain[n]])] = entry
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


def _as_scored_entries(model, hardware, rows, software, fallback, workload: Workload) -> list:
    """The classes' key numbers as the search scored their plans `rows` (even stages): with
    `software`, or with `fallback` where that does not fit and this does (planner.search.overlaps:
    the free overlaps, off where their buffers push the plan out of memory)."""
    cands = _candidate_arrays(rows)
    kw = workload.score_kw()
    scored = [_scored_with(model, hardware, cands, software, kw)]
    if fallback is not None and not np.all(scored[0][1].fits):
        scored.append(_scored_with(model, hardware, cands, fallback, kw))
    out = []
    for n in range(len(rows["dp"])):
        sw, scores, x, block = scored[0]
        if len(scored) > 1 and not scores.fits[n] and scored[1][1].fits[n]:
            sw, scores, x, block = scored[1]
        cfg = config_of(rows, n, framework=sw.framework.name, **kw)
        cfg = replace(
            cfg, stages=tuple(even_stages(model.total_blocks, cfg.pp * cfg.virtual_stages))
        )
        one = Estimate(
            model=model,
            hardware=hardware,
            config=cfg,
            gpus=cfg.world_size,
            software=sw,
            scores=_documented_scores(replace(_score_row(scores, n), step=x.take(np.array([n])))),
        )
        out.append(
            {
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
        )
    return out


def _scored_with(model, hardware, cands, software, kw) -> tuple:
    """(software, scores, Step, block seconds) of candidates under one software."""
    x = Step.of(model, hardware, software, cands, **kw)
    return software, score(model, hardware, cands, software=software, **kw), x, block_seconds(x)


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


def ranked_documents(documents: list[dict], setup: Setup) -> list[dict]:
    """The leaders' documents as recommend returns them: those that fit (all when none does), with
    their cost and goodput (`_with_cost`), in the objective's order, the first `top` with their error
    bands (planner.uncertainty.with_bands: copies)."""
    r = setup.request
    documents = [d for d in documents if d["prediction"]["memory"]["fits"]] or documents
    documents = [
        _with_cost(d, setup.price, r.spot, r.tokens, setup.hardware, setup.reliability)
        for d in documents
    ]
    documents.sort(key=lambda d: _objective_value(d, r.objective))
    return with_bands(documents[: r.top])
