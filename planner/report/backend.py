"""The report's only doorway into the rest of the planner: model resolution, hardware profiles,
estimate, recommend and the communication models. Everything here calls library code; nothing
here costs anything itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.plan import run_options
from planner.run_options import RunOptions
from planner.report.timeline import StageTimes
from frameworks import load_framework
from hardware_profiles import load_profile
from planner.candidates import FIELDS
from planner.catalog import CATALOG
from planner.estimate import even_stages, rank_blocks, rank_recomputed
from planner.goodput import (
    ReliabilityInputs,
    goodput_by_gpus,
    reliability_figures,
    with_reliability,
)
from planner.parallel import LOOPED_SCHEDULES, SCHEDULES, looped_rounds_ok
from planner.score import score
from planner.search import config_of, recommend
from planner.sources import resolve_model, transformer_spec
from cost_models import flops as FL
from cost_models.pipeline import p2p_transfers_on_critical_path
from cost_models import comm

_CONFIG_FIELDS = frozenset(f.name for f in fields(ParallelConfig))


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """What the report needs from one search: the ranked plans and every scored candidate."""

    best: Mapping[str, Any]
    alternatives: tuple[Mapping[str, Any], ...]
    candidates_evaluated: int
    feasible: int
    seconds: float
    tokens_per_s: np.ndarray
    """Predicted tokens/s of every scored candidate."""
    peak_bytes: np.ndarray
    """Predicted peak bytes per GPU of every scored candidate."""
    fits: np.ndarray
    pp: np.ndarray
    """Pipeline degree of every scored candidate."""
    step_time_s: np.ndarray
    """Predicted step time of every scored candidate, seconds."""
    best_pipelined: ParallelConfig | None = None
    """The fastest fitting scored candidate with pp > 1 (evenly split), if any."""


def resolve(model_arg: str, seq: int | None):
    """The TransformerSpec the cost model scores. A `package.module:factory` is profiled on the meta
    device (planner.sources); it can be scored when the module exposes its TransformerSpec."""
    return transformer_spec(resolve_model(model_arg, seq=seq))


def hardware(name: str):
    return load_profile(name)


def config_from_document(doc: Mapping[str, Any]) -> ParallelConfig:
    plan = doc["plan"]
    return ParallelConfig(
        **{k: (tuple(v) if k == "stages" else v) for k, v in plan.items() if k in _CONFIG_FIELDS}
    )


def estimate_document(model, hw, cfg: ParallelConfig, *, gpus: int, options=None) -> dict[str, Any]:
    """estimate()'s plan document of cfg, run with `options` (a plan's own: run_options)."""
    return estimate(model, hw, cfg, gpus=gpus, options=options).to_document()


def step_timeline(doc: Mapping[str, Any]):
    """The simulated step (cost_models.timeline.StepTimeline) of a plan document: its model,
    hardware, degrees and run options estimated again (planner.estimate reads the step off it)."""
    plan = doc["plan"]
    model = resolve(doc["model"]["name"], plan.get("seq"))
    est = estimate(
        model,
        hardware(doc["hardware"]["name"]),
        config_from_document(doc),
        gpus=doc["hardware"]["gpus"],
        options=run_options(doc),
    )
    return est.scores.timeline


def step_title(doc: Mapping[str, Any], step) -> str:
    """The title of a plan's simulated-step figure (explain --timeline and the report)."""
    p = doc["plan"]
    return (
        f"{doc['model']['name']}: dp{p['dp']} tp{p['tp']} pp{p['pp']} cp{p.get('cp', 1)}, "
        f"{p['schedule']}, {p['num_microbatches']} micro-batches, simulated {step.makespan_s:.4g} s"
    )


def batchnorm_count(model_arg: str) -> int:
    """BatchNorm modules (any torch.nn.modules.batchnorm._BatchNorm, SyncBatchNorm included) in the
    model: 0 for catalog and config.json transformers (LayerNorm/RMSNorm); a `package.module:factory`
    is built on the meta device (planner.module_profiler.build_on_meta) and its modules counted."""
    if model_arg in CATALOG or model_arg.endswith(".json") or ":" not in model_arg:
        return 0
    import torch

    # optional heavy dependency: planner.module_profiler imports torch at its top
    from planner.module_profiler import build_on_meta

    module = build_on_meta(model_arg)
    return sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())


def search(
    model,
    hw,
    scenario,
    *,
    top: int | None = None,
    global_batch: int | None = None,
    options: RunOptions | None = None,
) -> SearchResult:
    """recommend() for the scenario, recording every candidate its scorer evaluated; `options`:
    the run options every candidate runs with (a given plan's own: run_options).

    recommend() returns only the ranked documents; the Pareto front needs every scored candidate,
    so recommend() is handed planner.score.score wrapped to keep a copy of each batch it scores
    (memory-bound probes included where their micro-batch count is one a plan may have). Same search, same cost model.
    """
    batches: list[tuple[np.ndarray, ...]] = []
    best_piped: list[
        tuple[float, dict[str, Any], int]
    ] = []  # fastest fitting pp > 1 candidate of each batch, its global batch

    def recording_score(model_, hw_, cands, **kw):
        scores = score(model_, hw_, cands, **kw)
        pp = np.asarray(cands.pp)
        # the search's memory-bound probes take the leanest micro-batch before the looped schedules'
        # rounds rule is applied (planner/candidates.py): keep only rows a plan could have
        m = kw["global_batch"] // (np.asarray(cands.dp) * np.asarray(cands.micro_batch))
        looped = np.isin(np.asarray(cands.schedule), [SCHEDULES.index(n) for n in LOOPED_SCHEDULES])
        runnable = ~looped | looped_rounds_ok(m, pp)
        step = np.asarray(scores.step_time_s, dtype=float)
        peak = np.asarray(scores.peak_bytes_per_gpu, dtype=float)
        fits = np.asarray(scores.fits, dtype=bool)  # the cost model's one "fits"
        batches.append((pp[runnable], step[runnable], peak[runnable], fits[runnable]))
        piped = np.flatnonzero((pp > 1) & fits & runnable)
        if len(piped):
            i = piped[np.argmin(step[piped])]
            row = {k: np.asarray(getattr(cands, k))[i : i + 1] for k in FIELDS}
            best_piped.append((float(step[i]), row, int(kw["global_batch"])))
        return scores

    top = scenario.top if top is None else top
    rec = recommend(
        model,
        hw,
        gpus=scenario.gpus,
        global_batch=global_batch or scenario.global_batch,
        seq=scenario.seq,
        precision=scenario.precision,
        optimizer=scenario.optimizer,
        objective=scenario.objective,
        top=top + 1,
        tokens=scenario.train_tokens,
        score_fn=recording_score,
        framework=scenario.framework,
        reliability=getattr(scenario, "reliability", None),
        price_per_hour=getattr(scenario, "price_per_hour", None)
        or (hw.price_usd_per_hour if getattr(scenario, "spot", False) else None),
        spot=getattr(scenario, "spot", False),
        options=options,
        **_space(scenario),
    )
    plan = rec.best["plan"]
    pp, step, peak, fits = (
        np.concatenate([b[i] for b in batches]) if batches else np.zeros(0) for i in range(4)
    )
    pipelined = None
    if best_piped:
        _, row, row_batch = min(best_piped, key=lambda t: t[0])
        pipelined = config_of(
            row,
            0,
            global_batch=row_batch,
            seq=plan["seq"],
            precision=scenario.precision,
            optimizer=scenario.optimizer,
            framework=scenario.framework,
        )
    return SearchResult(
        best=rec.best,
        alternatives=tuple(rec.alternatives),
        best_pipelined=pipelined,
        candidates_evaluated=rec.stats.candidates_evaluated,
        feasible=rec.stats.feasible,
        seconds=rec.stats.seconds,
        tokens_per_s=plan["global_batch"] * plan["seq"] / step,
        peak_bytes=peak,
        fits=fits.astype(bool),
        pp=pp,
        step_time_s=step,
    )


def _space(scenario) -> dict:
    """recommend()'s `space` keyword when the scenario pins degrees (--cp, --ep, --dp-shard)."""
    space = getattr(scenario, "space", None)
    return {} if space is None else {"space": space}


def stage_memory(
    doc: Mapping[str, Any], alternatives: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Memory bars: one per pipeline rank (prediction.memory_per_rank; a rank holds all its chunks)
    when the plan has a pipeline, else the plan's GPU beside each runner-up's peak rank."""
    per_rank = doc["prediction"].get("memory_per_rank") or []
    if len(per_rank) > 1 and all("params_bytes" in s for s in per_rank):
        return [{"label": f"stage {s['rank']}", **s} for s in per_rank]
    bars = [{"label": "recommended (peak rank)", **doc["prediction"]["memory"]}]
    bars += [
        {"label": f"runner-up {i}", **d["prediction"]["memory"]}
        for i, d in enumerate(alternatives, 1)
    ]
    return bars


def stage_times(model, doc: Mapping[str, Any]) -> tuple[list[StageTimes], float]:
    """Per-micro-batch forward/backward seconds of each pipeline rank, and one p2p hop, from the estimate.

    The estimate prices a step as m x (slowest stage) + bubble + p2p; its `compute` and `tp_comm`
    terms are m x that stage time. The stage time is split into forward and backward by the
    model's FLOP counts (cost_models.flops: forward, backward, recomputation run in backward), and
    `pp_p2p` over the hops on the critical path (cost_models.pipeline) gives one hop.
    """

    p, tb = doc["plan"], doc["prediction"]["time_breakdown_s"]
    m = p["num_microbatches"]
    stage_s = (float(tb["compute"]) + float(tb.get("tp_comm", 0.0))) / m
    b, s = p["micro_batch"], p["seq"]
    fwd = float(FL.block_flops_fwd(model, b, s))
    rec = float(FL.block_recompute_flops(model, b, s, p["recompute"]))
    if p.get(
        "recompute_layers"
    ):  # only the first N blocks of each chunk recomputed: the busiest rank's share
        chunks = list(
            p.get("stages") or even_stages(model.total_blocks, p["pp"] * p["virtual_stages"])
        )
        blocks = rank_blocks(chunks, p["pp"])
        busiest = max(range(p["pp"]), key=blocks.__getitem__)
        rec *= rank_recomputed(chunks, p["pp"], p["recompute_layers"])[busiest] / max(
            blocks[busiest], 1
        )
    bwd = float(FL.block_flops_bwd(model, b, s)) + rec
    forward_s = stage_s * fwd / (fwd + bwd)
    hops = float(p2p_transfers_on_critical_path(p["pp"], m, p["virtual_stages"]))
    p2p_s = float(tb.get("pp_p2p", 0.0)) / hops if hops else 0.0
    times = [StageTimes(forward_s=forward_s, backward_s=stage_s - forward_s)] * p["pp"]
    return times, p2p_s


def seed_comparison(
    hw, doc: Mapping[str, Any], result: SearchResult | None, nodes: int
) -> dict[str, Any]:
    """The seed's log-n relative all-reduce cost at `nodes` nodes beside the calibrated models.

    - seed_relative: cost_models.comm.relative_allreduce_cost (1/2 + 1/2 * 1/log2(n)).
    - calibrated_hierarchical: the alpha-beta hierarchical all-reduce of the model's gradients over
      n nodes x d devices (inside the node over NVLink, across nodes on a 1/d shard) relative to a
      flat all-reduce in which every rank crosses the network (cost_models.comm).
    - calibrated_step: best step time among the scored pipelined candidates (pp > 1) relative to
      the best pure-data-parallel one (pp = 1) at this node count, both fitting (planner.score).
    """

    d = hw.devices_per_node
    p = doc["plan"]
    # the gradient bytes the plan's framework reduces (frameworks/*.json state_bytes.reduce)
    grad_bytes = (
        doc["model"]["params"]
        * load_framework(p.get("framework", "megatron")).state_bytes[p["precision"]].reduce
    )
    hier = float(comm.group_collective_seconds("allreduce", grad_bytes, nodes * d, d, hw))
    flat = float(comm.group_collective_seconds("allreduce", grad_bytes, nodes * d, 1, hw))
    row = {
        "seed_relative": float(comm.relative_allreduce_cost(nodes, d)),
        "calibrated_hierarchical": hier / flat if flat else None,
        "hierarchical_allreduce_s": hier,
        "flat_allreduce_s": flat,
        "gradient_GB": grad_bytes / 1e9,
    }
    if result is not None and len(result.step_time_s):
        piped, pure_dp = result.fits & (result.pp > 1), result.fits & (result.pp == 1)
        if piped.any() and pure_dp.any():
            row["calibrated_step"] = float(
                result.step_time_s[piped].min() / result.step_time_s[pure_dp].min()
            )
    return row


def with_goodput(doc: Mapping[str, Any], hw, scenario) -> dict[str, Any]:
    """The document with its goodput for the scenario's run (planner.goodput), computed here only when
    the document does not carry it (a plan file's re-estimate); recommend's documents already do."""
    doc = dict(doc)
    if "reliability" in doc.get("prediction", {}):
        return doc
    doc["plan"], doc["prediction"] = dict(doc["plan"]), dict(doc["prediction"])
    price = hw.price_usd_per_hour * doc["hardware"]["nodes"] if hw.price_usd_per_hour else None
    figures = reliability_figures(
        doc, hw, tokens=scenario.train_tokens, price_per_hour=price, inputs=_inputs(scenario)
    )
    return with_reliability(doc, figures)


def goodput_curve(doc: Mapping[str, Any], hw, scenario, gpus: Sequence[int]) -> list[float]:
    """Goodput of the plan's checkpoint on the same storage at other cluster sizes (planner.goodput)."""
    return goodput_by_gpus(doc, hw, gpus, inputs=_inputs(scenario))


def _inputs(scenario):
    return getattr(scenario, "reliability", None) or ReliabilityInputs()
