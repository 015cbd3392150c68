"""Assemble a report from library calls: recommend (search), estimate (the chosen plan, what-ifs,
scaling) and the seed's communication model; then draw and render it.

Every number shown comes from one of those calls for the same plan; this module only arranges
them (and derives run time as whole steps x step time, and cost as hours x nodes x price).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from planner.errors import ConfigError, NoFitError, PlannerError
from planner.run_options import RunOptions
from planner.report import checklist, figures
from planner.report import backend
from planner.report.render import Figure, ReportContent, Section, Table, table_from_records
from planner.report.timeline import build_timeline
from planner.report.checklist import GOODPUT_WARN_FRACTION

GB = 1e9
GiB = 2**30
"""Memory is shown in GiB, as the command line shows it; storage and bandwidth stay decimal (GB,
GB/s)."""
GPT3_TRAIN_TOKENS = 300e9
"""Tokens GPT-3 was trained on (Brown et al. 2020, Sec. 2.2); the default run length."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario:
    """What the user asked about: a model on a cluster, with a batch and a precision."""

    model: str
    """Model argument (catalog name, config.json path or package.module:factory)."""
    hardware: str
    """Hardware profile name or path."""
    gpus: int
    global_batch: int | None = None
    """Sequences per step; None lets recommend choose its default."""
    seq: int | None = None
    precision: str = "amp-bf16"
    optimizer: str = "adamw"
    objective: str = "throughput"
    top: int = 3
    """Runners-up to show."""
    train_tokens: float = GPT3_TRAIN_TOKENS
    """Tokens of the whole run, for time to train and cost."""
    scaling_nodes: tuple[int, ...] = ()
    """Node counts of the scaling study; empty chooses around the scenario's node count."""
    framework: str = "megatron"
    """The software stack (frameworks/*.json): costs and which plans are searched."""
    reliability: Any = None
    """planner.goodput.ReliabilityInputs for the goodput section (None: the sourced defaults)."""
    price_per_hour: float | None = None
    """US dollars per node-hour instead of the profile's (recommend --price-per-hour)."""
    spot: bool = False
    """Price with the profile's spot price (or price_per_hour) (recommend --spot)."""
    space: Any = None
    """planner.candidates.SearchSpace of the pinning flags (--cp, --ep, --dp-shard); None: the full
    space."""


def priced(hw, scenario: Scenario):
    """The hardware profile with the price the scenario asks for (--price-per-hour, else the spot
    price with
    --spot), so that every cost figure of the report uses the price the search ranked with."""
    if scenario.price_per_hour is not None:
        return dataclasses.replace(hw, price_usd_per_hour=scenario.price_per_hour)
    if scenario.spot:
        if hw.spot_price_usd_per_hour is None:
            raise ConfigError(
                "spot",
                True,
                "a profile with a spot price, or --price-per-hour",
                message=f"--spot needs a spot price: {hw.name}'s profile has none "
                "(spot prices move daily); pass today's with --price-per-hour "
                "USD (per node)",
            )
        return dataclasses.replace(hw, price_usd_per_hour=hw.spot_price_usd_per_hour)
    return hw


def build_report(
    scenario: Scenario, *, plan_document: Mapping[str, Any] | None = None
) -> ReportContent:
    """Search (or take `plan_document`'s configuration), evaluate, and lay out the report."""
    model = backend.resolve(scenario.model, scenario.seq)
    hw = priced(backend.hardware(scenario.hardware), scenario)
    options = _search_options(plan_document, scenario)
    search = backend.search(model, hw, scenario, options=options)
    notes: list[str] = []
    if plan_document is None:
        best, first_label = search.best, "recommended"
        alternatives = list(search.alternatives)
    else:
        cfg = backend.config_from_document(plan_document)
        best = backend.with_goodput(
            backend.estimate_document(model, hw, cfg, gpus=scenario.gpus, options=options),
            hw,
            scenario,
        )
        first_label = "plan file"
        alternatives = [search.best] + list(search.alternatives)[: max(scenario.top - 1, 0)]
        if abs(
            float(plan_document["prediction"]["step_time_s"])
            - float(best["prediction"]["step_time_s"])
        ) > 1e-9 * float(best["prediction"]["step_time_s"]):
            notes.append(
                "The plan file's prediction differs from this build's estimate; the report shows "
                "the current estimate of the plan's configuration."
            )
    ctx = rule_context(model, hw, best, scenario)
    rules = checklist.evaluate(ctx)
    scaling_rows = _scaling(model, hw, scenario, best, search, options=options)
    seed_rows = _seed_argument(hw, scaling_rows)
    sections = [
        _scenario_section(model, hw, scenario, best, search),
        _plans_section(best, alternatives, first_label, plan_document is not None, scenario, hw),
        _time_memory_section(best, alternatives),
        _timeline_section(model, hw, best, search, plan_document is None),
        _pareto_section(search, best),
        _scaling_section(scaling_rows, scenario, hw, given=plan_document is not None),
        _goodput_section(best, hw, scenario),
        _seed_section(seed_rows, best),
    ]
    title = (
        f"Parallel training report: {best['model']['name']} on {best['hardware']['gpus']} x "
        f"{hw.device} ({best['hardware']['nodes']} x {hw.name})"
    )
    data = {
        "scenario": dataclasses.asdict(scenario),
        "best": best,
        "alternatives": alternatives,
        "search": {
            "candidates_evaluated": search.candidates_evaluated,
            "feasible": search.feasible,
            "seconds": search.seconds,
            "scored": len(search.step_time_s),
        },
        "scaling": [
            {k: v for k, v in r.items() if k not in ("document", "search")} for r in scaling_rows
        ],
        "seed_argument": seed_rows,
        "checklist": [dataclasses.asdict(r) for r in rules],
    }
    return ReportContent(
        title=title, sections=tuple(sections), checklist=tuple(rules), notes=tuple(notes), data=data
    )


# --- checklist context ---------------------------------------------------------------------------


def rule_context(model, hw, best: Mapping[str, Any], scenario: Scenario) -> checklist.RuleContext:
    """The checklist's view of the plan `best`: its what-ifs are estimate() of the plan's configuration
    with fields changed (the one cost model), each computed once."""
    base_cfg = backend.config_from_document(best)
    options = backend.run_options(best)  # a what-if changes the plan, not how the run is set up
    tried: dict[str, tuple[Mapping[str, Any] | None, str | None]] = {}

    def attempt(hardware_changes: Mapping[str, Any] | None, changes: Mapping[str, Any]):
        key = repr((sorted((hardware_changes or {}).items()), sorted(changes.items())))
        if key not in tried:
            try:
                # recompute_layers counts the blocks of a chunk that full recomputation re-runs: a what-if of another
                # recomputation or another chunking means every block again
                if set(changes) & {"recompute", "pp", "virtual_stages", "stages"}:
                    changes = {**changes, "recompute_layers": None}
                cfg = dataclasses.replace(base_cfg, **changes)
                if changes.get("seq") is not None and changes["seq"] != base_cfg.seq:
                    m = backend.resolve(scenario.model, changes["seq"])
                else:
                    m = model
                h = dataclasses.replace(hw, **hardware_changes) if hardware_changes else hw
                doc = backend.estimate_document(
                    m, h, cfg, gpus=base_cfg.world_size, options=options
                )
                tried[key] = (doc, None)
            except PlannerError as error:
                tried[key] = (None, str(error))
        return tried[key]

    def what_if(hardware_changes: Mapping[str, Any] | None = None, **changes):
        return attempt(hardware_changes, changes)[0]

    def why_not(hardware_changes: Mapping[str, Any] | None = None, **changes):
        return attempt(hardware_changes, changes)[1]

    return checklist.RuleContext(
        document=best,
        hardware=hw,
        batchnorm_modules=backend.batchnorm_count(scenario.model),
        what_if=what_if,
        why_not=why_not,
        spec=model,
        train_tokens=scenario.train_tokens,
        tp_group_nodes=checklist.tp_group_nodes(best["plan"], hw.devices_per_node),
    )


# --- sections ------------------------------------------------------------------------------------


def shard_group(p: Mapping[str, Any]) -> str:
    """The ZeRO shard group of a plan: '-' without sharding, 'all' over every data-parallel rank,
    else its size."""
    if p.get("zero", 0) == 0:
        return "-"
    return "all" if p.get("dp_shard", 0) in (0, p["dp"]) else str(p["dp_shard"])


def axes_label(p: Mapping[str, Any]) -> str:
    """Every parallel axis of a plan, as in the plan tables: 'dp4 tp2 pp1 cp8 ep1 shard all'."""
    return (
        f"dp{p['dp']} tp{p['tp']} pp{p['pp']} cp{p.get('cp', 1)} ep{p.get('ep', 1)} "
        f"shard {shard_group(p)}"
    )


def _plan_row(rank: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    p, pred = doc["plan"], doc["prediction"]
    cp = p.get("cp", 1)
    return {
        "plan": rank,
        "dp": p["dp"],
        "tp": p["tp"],
        "pp": p["pp"],
        "cp": f"{cp} {p.get('cp_comm', 'p2p')}" if cp > 1 else 1,
        "ep": p.get("ep", 1),
        "shard group": shard_group(p),
        "micro-batch": p["micro_batch"],
        "micro-batches": p["num_microbatches"],
        "schedule": p["schedule"],
        "v": p["virtual_stages"],
        "ZeRO": p["zero"],
        "recompute": p["recompute"]
        + (f" ({p['recompute_layers']}/chunk)" if p.get("recompute_layers") else ""),
        "offload": p["offload"],
        "SP": p["sequence_parallel"],
        "placement": p["placement"],
        "step s": float(pred["step_time_s"]),
        "tokens/s": float(pred["tokens_per_s"]),
        "TFLOP/s/GPU": float(pred["tflops_per_gpu"]),
        "MFU": f"{100 * float(pred['mfu']):.1f}%",
        "peak GiB": round(pred["memory"]["peak_bytes_per_gpu"] / GiB, 2),
        "fits": pred["memory"]["fits"],
    }


_PLAN_COLUMNS = (
    "plan",
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "shard group",
    "micro-batch",
    "micro-batches",
    "schedule",
    "v",
    "ZeRO",
    "recompute",
    "offload",
    "SP",
    "placement",
    "step s",
    "tokens/s",
    "TFLOP/s/GPU",
    "MFU",
    "peak GiB",
    "fits",
)


def _scenario_section(model, hw, scenario: Scenario, best, search) -> Section:
    m, h, p = best["model"], best["hardware"], best["plan"]
    rows = [
        ("model", f"{m['name']} ({m['params'] / 1e9:.2f} B parameters)"),
        (
            "hardware",
            f"{h['nodes']} x {hw.name} = {h['gpus']} x {hw.device} "
            f"({hw.memory_bytes / GiB:.1f} GiB, {hw.intra_node_GBps_per_device:g} GB/s/device "
            f"NVLink, {hw.inter_node_Gbps_per_node:g} Gbit/s/node network)",
        ),
        (
            "global batch",
            f"{p['global_batch']} sequences x {p['seq']} tokens = "
            f"{p['global_batch'] * p['seq']:,} tokens per step",
        ),
        ("precision / optimizer", f"{p['precision']} / {p.get('optimizer', scenario.optimizer)}"),
        ("objective", scenario.objective),
        ("training run", f"{scenario.train_tokens:.3g} tokens"),
        (
            "search",
            f"{search.candidates_evaluated:,} candidates evaluated, {search.feasible:,} fit, "
            f"{search.seconds:.2f} s",
        ),
    ]
    return Section(title="Scenario", tables=(Table(columns=("", ""), rows=tuple(rows)),))


def _plans_section(
    best, alternatives, first_label: str, from_file: bool, scenario: Scenario, hw
) -> Section:
    others = "recommend #{}" if from_file else "runner-up {}"
    records = [_plan_row(first_label, best)] + [
        _plan_row(others.format(i), d) for i, d in enumerate(alternatives, 1)
    ]
    pred = best["prediction"]
    text = (
        f"The {first_label} plan runs a step in {float(pred['step_time_s']):.4g} s: "
        f"{float(pred['tokens_per_s']):,.0f} tokens/s, {float(pred['tflops_per_gpu']):.4g} TFLOP/s per GPU "
        f"(MFU {100 * float(pred['mfu']):.1f}%), peak {pred['memory']['peak_bytes_per_gpu'] / GiB:.2f} GiB "
        f"of {pred['memory']['capacity_bytes'] / GiB:.2f} GiB per GPU."
    )
    hours = checklist.run_seconds(best, scenario.train_tokens) / 3600.0
    text += (
        f" Training on {scenario.train_tokens:.3g} tokens takes {hours / 24:.1f} days"
        + (
            f" (${hours * best['hardware']['nodes'] * hw.price_usd_per_hour:,.0f} at "
            f"${hw.price_usd_per_hour:g} per node-hour)"
            if hw.price_usd_per_hour
            else ""
        )
        + " if nothing ever fails"
    )
    rel = pred.get("reliability")
    if rel:
        usd = f", ${rel['usd']:,.0f}" if "usd" in rel else ""
        text += (
            f"; with the expected failures, checkpoints and restarts, {rel['time_to_train_s'] / 86400:.1f} days"
            f"{usd} (goodput {100 * rel['goodput']:.1f}%, section 'Goodput under failures')."
        )
    else:
        text += "."
    return Section(
        title="Recommended plan and runners-up",
        paragraphs=(text,),
        tables=(table_from_records(records, _PLAN_COLUMNS),),
    )


def _time_memory_section(best, alternatives) -> Section:
    pred = best["prediction"]
    tb_all = {k: float(v) for k, v in pred["time_breakdown_s"].items()}
    tb = {
        k: v for k, v in tb_all.items() if "_part_of_" not in k
    }  # parts are already inside a term
    step = float(pred["step_time_s"])
    time_rows = tuple(
        (
            k.replace("_part_of_", " (part of ") + (")" if "_part_of_" in k else ""),
            v,
            f"{100 * v / step:.1f}%",
        )
        for k, v in tb_all.items()
    )
    stages = backend.stage_memory(best, alternatives)
    mem = pred["memory"]
    mem_keys = (
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "other_bytes",
    )
    stage_rows = tuple(
        (
            s["label"],
            *(round(s.get(k, 0) / GiB, 3) for k in mem_keys),
            round(sum(s.get(k, 0) for k in mem_keys) / GiB, 3),
        )
        for s in stages
    )
    figs = (
        Figure(
            name="time_breakdown",
            title="Where the step time goes",
            caption=f"Seconds per optimizer step by term (estimate); step time {step:.4g} s.",
            png=figures.time_breakdown(tb, step, "Time breakdown of one step"),
        ),
        Figure(
            name="stage_memory",
            title="Memory breakdown against capacity",
            caption=(
                f"Per-GPU memory at the allocator's peak (estimate), by term, for each pipeline stage "
                f"(a rank with all its chunks and the micro-batches its schedule keeps in flight); the "
                f"highest, {mem['peak_bytes_per_gpu'] / GiB:.2f} GiB of {mem['capacity_bytes'] / GiB:.2f} GiB, "
                f"is the plan's peak."
                if stages and stages[0]["label"].startswith("stage")
                else f"Per-GPU memory at the allocator's peak (estimate), by term, beside the runners-up' "
                f"peak ranks: {mem['peak_bytes_per_gpu'] / GiB:.2f} GiB of {mem['capacity_bytes'] / GiB:.2f} GiB."
            ),
            png=figures.stage_memory(stages, mem["capacity_bytes"], "Peak memory per GPU"),
        ),
    )
    return Section(
        title="Time and memory breakdown",
        tables=(
            Table(columns=("term", "seconds per step", "share"), rows=time_rows),
            Table(
                columns=(
                    "plan",
                    "params GiB",
                    "grads GiB",
                    "optimizer GiB",
                    "activations GiB",
                    "other GiB",
                    "total GiB",
                ),
                rows=stage_rows,
            ),
        ),
        figures=figs,
    )


def _timeline_section(model, hw, best, search, searched_best: bool) -> Section:
    figs = [
        _timeline_figure(
            model, best, "pipeline_timeline", "Pipeline timeline of the chosen schedule"
        ),
        _simulated_step_figure(best),
    ]
    paragraphs = ()
    if best["plan"]["pp"] == 1 and search.best_pipelined is not None:
        cfg = search.best_pipelined
        piped = backend.estimate_document(model, hw, cfg, gpus=best["hardware"]["gpus"])
        ratio = float(piped["prediction"]["step_time_s"]) / float(best["prediction"]["step_time_s"])
        figs.append(
            _timeline_figure(
                model,
                piped,
                "pipeline_timeline_alternative",
                "Timeline of the best pipelined candidate, for comparison",
            )
        )
        paragraphs = (
            f"The {'recommended' if searched_best else 'given'} plan has no pipeline. For comparison, the "
            f"fastest fitting pipelined candidate of the search ({axes_label(cfg.to_dict())}, "
            f"{cfg.schedule}, v={cfg.virtual_stages}, micro-batch {cfg.micro_batch}) takes "
            f"{float(piped['prediction']['step_time_s']):.4g} s per step ({ratio:.2f}x), with a bubble of "
            f"{float(piped['prediction']['time_breakdown_s'].get('bubble', 0.0)):.4g} s (estimate).",
        )
    return Section(title="Pipeline timeline", paragraphs=paragraphs, figures=tuple(figs))


def _simulated_step_figure(doc) -> Figure:
    """The chosen plan's step as cost_models.timeline simulates it (explain --timeline draws the
    same figure), with its exposed data-parallel communication read off the simulation."""
    step = backend.step_timeline(doc)
    last = max(step.ranks, key=lambda span: span.end_s)
    slowed = last.end_s - last.compute_end_s - last.dp_exposed_s
    caption = (
        "The whole step as the timeline simulates it (cost_models.timeline): per pipeline rank a "
        "compute lane (forwards F, backwards B, weight gradients W; gaps are the bubble) and a "
        "data-parallel lane, its exposed part after the compute in red and its hidden part light. "
        f"Data-parallel communication on the last rank to finish: {last.dp_total_s * 1e3:.4g} ms, "
        f"{last.dp_exposed_s * 1e3:.4g} ms of it exposed after the compute, and the hidden part "
        f"slows the compute it shares the GPU with by {slowed * 1e3:.4g} ms: "
        f"{(last.dp_exposed_s + slowed) * 1e3:.4g} ms of the step in all; simulated step "
        f"{step.makespan_s:.4g} s."
    )
    return Figure(
        name="simulated_step",
        title="The chosen plan's step, simulated",
        caption=caption,
        png=figures.step_timeline(step, backend.step_title(doc, step)),
    )


def _timeline_figure(model, doc, name: str, title: str) -> Figure:
    p = doc["plan"]
    times, p2p_s = backend.stage_times(model, doc)
    shown_m = min(p["num_microbatches"], max(2 * p["pp"] * p["virtual_stages"], 8))
    if p["schedule"] == "interleaved-1f1b" and p["num_microbatches"] >= p["pp"]:
        shown_m = max(p["pp"], shown_m - shown_m % p["pp"])
    tl = build_timeline(
        p["schedule"], times, shown_m, virtual_stages=p["virtual_stages"], p2p_s=p2p_s
    )
    note = (
        ""
        if shown_m == p["num_microbatches"]
        else f" The first {shown_m} of {p['num_microbatches']} micro-batches are drawn; the steady state repeats."
    )
    f0, b0 = times[0].forward_s, times[0].backward_s
    if p["pp"] == 1:
        caption = (
            f"No pipeline (pp=1): the {p['num_microbatches']} micro-batches of {p['micro_batch']} run back "
            f"to back (gradient accumulation), forward {f0 * 1e3:.3g} ms and backward {b0 * 1e3:.3g} ms "
            f"each (estimate).{note}"
        )
    else:
        caption = (
            f"{p['schedule']} with {p['pp']} stages, v={p['virtual_stages']}: forward {f0 * 1e3:.3g} ms and "
            f"backward {b0 * 1e3:.3g} ms per micro-batch per stage (estimate: the slowest stage's time, "
            f"split by FLOPs), p2p {p2p_s * 1e3:.3g} ms per hop; the estimate's bubble is "
            f"{float(doc['prediction']['time_breakdown_s'].get('bubble', 0.0)):.4g} s per step.{note}"
        )
    return Figure(
        name=name,
        title=title,
        caption=caption,
        png=figures.pipeline_gantt(tl, f"{p['schedule']} schedule, {p['pp']} stages"),
    )


def _pareto_section(search, best) -> Section:
    tok, mem, fits = search.tokens_per_s, search.peak_bytes, search.fits
    front = pareto_mask(tok, mem)
    pred = best["prediction"]
    chosen = (float(pred["tokens_per_s"]), float(pred["memory"]["peak_bytes_per_gpu"]))
    cap = int(pred["memory"]["capacity_bytes"])
    fig = Figure(
        name="pareto_front",
        title="Throughput against memory of the searched candidates",
        caption=f"{len(tok):,} candidates scored by the search (memory-bound probes included); "
        f"{int(front.sum())} on the Pareto front (no other candidate is both faster and smaller)"
        + (
            f"; a random {figures.MAX_SCATTER_POINTS:,} of them drawn."
            if len(tok) > figures.MAX_SCATTER_POINTS
            else "."
        ),
        png=figures.pareto_front(tok, mem, fits, front, chosen, cap, "Searched candidates"),
    )
    if len(tok) and chosen[0] > tok.max() * (1 + 1e-9):
        fig = dataclasses.replace(
            fig,
            caption=fig.caption
            + (
                " The recommended plan (star) lies above the cloud: after scoring, recommend re-split its pipeline "
                "into uneven stages and re-estimated it, which no evenly split candidate matches."
            ),
        )
    idx = np.flatnonzero(front & fits)
    idx = idx[np.argsort(-tok[idx])][:8]
    rows = tuple((f"{tok[i]:,.0f}", round(mem[i] / GiB, 2)) for i in idx)
    return Section(
        title="Throughput vs memory (Pareto front)",
        tables=(Table(columns=("tokens/s", "peak GiB"), rows=rows),),
        figures=(fig,),
    )


def pareto_mask(tokens_per_s: np.ndarray, peak_bytes: np.ndarray) -> np.ndarray:
    """True where no other point has >= throughput and <= memory with one of them strict."""
    order = np.lexsort(
        (-tokens_per_s, peak_bytes)
    )  # by memory ascending, then throughput descending
    tok = tokens_per_s[order]
    best_before = np.concatenate([[-np.inf], np.maximum.accumulate(tok)[:-1]])
    mask = np.zeros(len(tokens_per_s), dtype=bool)
    mask[order] = tok > best_before
    return mask


# --- scaling and the log-n all-reduce model
# -----------------------------------------------------------------


def _node_counts(scenario: Scenario, hw, best) -> list[int]:
    if scenario.scaling_nodes:
        return sorted(set(scenario.scaling_nodes))
    n = best["hardware"]["nodes"]
    counts = {n, 2 * n} | {n // k for k in (2, 4, 8) if n // k >= 1}
    return sorted(counts)


def _search_options(plan_document, scenario: Scenario):
    """The run options a given plan's alternatives and scaling rows are searched with: the plan's
    own, as its file says, on its own stack; on another (report --framework) that stack's defaults,
    as an export to it starts from (planner.exports.retarget); None without a plan."""
    if plan_document is None:
        return None
    own = plan_document["plan"].get("framework")
    return backend.run_options(plan_document) if own == scenario.framework else RunOptions()


def _scaling(model, hw, scenario: Scenario, best, search, *, options=None) -> list[dict[str, Any]]:
    """The best plan at other node counts; with a given plan (`options`: its run options, which
    every search here runs with) its own row is marked."""
    given = options is not None  # a given plan's search
    rows = []
    for nodes in _node_counts(scenario, hw, best):
        gpus = nodes * hw.devices_per_node
        if gpus == best["hardware"]["gpus"]:
            doc, result = best, search
        else:
            try:
                result = backend.search(
                    model,
                    hw,
                    dataclasses.replace(scenario, gpus=gpus),
                    top=0,
                    global_batch=best["plan"]["global_batch"],
                    options=options,
                )
            except (NoFitError, ConfigError) as err:
                rows.append({"nodes": nodes, "gpus": gpus, "plan": f"none ({type(err).__name__})"})
                continue
            doc = result.best
        tok = float(doc["prediction"]["tokens_per_s"])
        hours = checklist.run_seconds(doc, scenario.train_tokens) / 3600.0
        p = doc["plan"]
        label = f"{axes_label(p)} {p['schedule']}"
        if given and doc is best:
            label += " (the given plan)"
        rel = doc["prediction"].get("reliability") or {}
        rows.append(
            {
                "nodes": nodes,
                "gpus": gpus,
                "plan": label,
                "goodput": rel.get("goodput"),
                "days_with_failures": rel["time_to_train_s"] / 86400.0 if rel else None,
                "tokens_per_s": tok,
                "step_time_s": float(doc["prediction"]["step_time_s"]),
                "mfu": float(doc["prediction"]["mfu"]),
                "days_to_train": hours / 24.0,
                "cost_usd": hours * nodes * hw.price_usd_per_hour
                if hw.price_usd_per_hour
                else None,
                "cost_spot_usd": hours * nodes * hw.spot_price_usd_per_hour
                if hw.spot_price_usd_per_hour
                else None,
                "document": doc,
                "search": result,
            }
        )
    return rows


def _scaling_section(rows, scenario: Scenario, hw, *, given: bool = False) -> Section:
    ok = [r for r in rows if "tokens_per_s" in r]
    table_rows = tuple(
        (
            r["nodes"],
            r["gpus"],
            r["plan"],
            r.get("tokens_per_s"),
            r.get("step_time_s"),
            f"{100 * r['mfu']:.1f}%" if "mfu" in r else None,
            r.get("days_to_train"),
            f"{100 * r['goodput']:.1f}%" if r.get("goodput") else None,
            r.get("days_with_failures"),
            r.get("cost_usd"),
        )
        for r in rows
    )
    figs = ()
    if ok:
        figs = (
            Figure(
                name="scaling",
                title="Scaling across node counts",
                caption=f"Best plan found at each node count (recommend, same global batch"
                f"{'; the given plan at its own node count' if given else ''}); time and cost "
                f"for {scenario.train_tokens:.3g} tokens at {hw.price_usd_per_hour or 0:g} USD/node-hour.",
                png=figures.scaling(ok, "Throughput, cost and time to train vs nodes"),
            ),
        )
    return Section(
        title="Scaling across node counts",
        tables=(
            Table(
                columns=(
                    "nodes",
                    "GPUs",
                    "best plan",
                    "tokens/s",
                    "step s",
                    "MFU",
                    "days to train",
                    "goodput",
                    "days with failures",
                    "cost USD",
                ),
                rows=table_rows,
            ),
        ),
        figures=figs,
    )


GOODPUT_CURVE_MAX_GPUS = 16384
"""The goodput figure reaches at least Llama 3 405B's 16,384 GPUs (Grattafiori et al. 2024)."""


def _goodput_section(best, hw, scenario: Scenario) -> Section:
    """Expected interruptions, checkpoint interval, lost hours and the cost of reliability for the plan's
    run (prediction.reliability, planner.goodput), and goodput against cluster size."""
    title = "Goodput under failures"
    rel = best["prediction"].get("reliability")
    if not rel:
        return Section(
            title=title, paragraphs=("No run length: goodput is computed for a run of --tokens.",)
        )
    step = float(best["prediction"]["step_time_s"])
    days, days0 = (
        rel["time_to_train_s"] / 86400.0,
        rel["time_to_train_without_failures_s"] / 86400.0,
    )
    steps = max(1, round(rel["checkpoint_interval_s"] / step))
    cost = (
        f" The failures, restarts and checkpoints cost ${rel['usd_reliability']:,.0f} on top of the "
        f"${rel['usd_without_failures']:,.0f} of the run itself."
        if "usd" in rel
        else ""
    )
    text = (
        f"Over the {days:.1f} days of the run ({days0:.1f} if nothing failed) the job is expected to be "
        f"interrupted {rel['expected_interruptions']:.1f} times: one interruption every "
        f"{rel['mtbf_hours']:.1f} h on {best['hardware']['gpus']:,} GPUs and {best['hardware']['nodes']:,} nodes "
        f"({rel['failure_rate_per_gpu_hour']:.3g} per GPU-hour and {rel['failure_rate_per_node_hour']:.3g} per "
        f"node-hour). Each checkpoint holds {rel['checkpoint_bytes'] / GB:,.0f} GB "
        f"({rel['checkpoint_bytes_per_gpu'] / GB:.2f} GB on the largest GPU) and is written to "
        f"{rel['storage']} in {rel['checkpoint_write_s']:.0f} s ({rel['checkpoint']}: training stalls "
        f"{rel['checkpoint_stall_s']:.1f} s); the interval that minimises the expected time (Daly 2006) is "
        f"{rel['checkpoint_interval_s'] / 60:.1f} min, every {steps:,} steps. A restart costs "
        f"{rel['restart_s']:.0f} s ({rel['restart_overhead_s']:.0f} s to get going, "
        f"{rel['checkpoint_read_s']:.0f} s to read the checkpoint). Expected losses: "
        f"{rel['lost_hours']:.1f} h of redone work and restarts and {rel['checkpoint_hours']:.1f} h of "
        f"checkpoints, a goodput of {100 * rel['goodput']:.1f}%.{cost}"
    )
    rows = (
        ("goodput", f"{100 * rel['goodput']:.1f}%"),
        ("expected interruptions", rel["expected_interruptions"]),
        ("job MTBF (h)", rel["mtbf_hours"]),
        ("checkpoint interval (min)", rel["checkpoint_interval_s"] / 60),
        (
            "checkpoint write / stall / read (s)",
            f"{rel['checkpoint_write_s']:.1f} / {rel['checkpoint_stall_s']:.1f} / {rel['checkpoint_read_s']:.1f}",
        ),
        ("restart (s)", rel["restart_s"]),
        ("lost hours", rel["lost_hours"]),
        ("checkpoint hours", rel["checkpoint_hours"]),
        ("days to train without / with failures", f"{days0:.1f} / {days:.1f}"),
        ("cost of reliability (USD)", rel.get("usd_reliability")),
    )
    gpus = best["hardware"]["gpus"]
    per_node = hw.devices_per_node
    top = max(GOODPUT_CURVE_MAX_GPUS, 4 * gpus)
    sizes = sorted({per_node * 2**k for k in range(0, 30) if per_node * 2**k <= top} | {gpus})
    curve = backend.goodput_curve(best, hw, scenario, sizes)

    fig = Figure(
        name="goodput_by_size",
        title="Goodput as the cluster grows",
        caption=(
            f"Expected goodput of this plan's checkpoint ({rel['checkpoint_bytes'] / GB:,.0f} GB, "
            f"{rel['checkpoint']} to {rel['storage']}) as data parallelism grows the cluster: failures "
            f"grow with the GPUs and nodes; the restart reads every replica's state from the same "
            f"storage. Daly 2006's optimum interval at each size."
        ),
        png=figures.goodput_by_size(
            sizes, curve, gpus, rel["goodput"], GOODPUT_WARN_FRACTION, "Goodput vs cluster size"
        ),
    )
    return Section(
        title=title,
        paragraphs=(text,),
        tables=(Table(columns=("", ""), rows=rows),),
        figures=(fig,),
    )


def _seed_argument(hw, scaling_rows) -> list[dict[str, Any]]:
    return [
        {"nodes": r["nodes"], **backend.seed_comparison(hw, r["document"], r["search"], r["nodes"])}
        for r in scaling_rows
        if r["nodes"] >= 2 and "document" in r
    ]


def _seed_section(rows, best) -> Section:
    paragraphs = (
        "A common back-of-the-envelope model of all-reduce says: half of the reduction stays inside "
        "the node on fast links and half crosses the network, where a tree over n nodes takes log2(n) "
        "steps, each carrying 1/log2(n) of the data, a relative cost of 1/2 + 1/2 * 1/log2(n) (0.625 for "
        "16 nodes of 8 GPUs; cost_models.comm.relative_allreduce_cost). Below, that model is evaluated "
        "for this scenario's node counts beside the calibrated models: the alpha-beta hierarchical "
        "all-reduce of this model's gradients relative to a flat one where every rank crosses the "
        "network, and the full step-time estimate of the best pipelined plan relative to the best pure "
        "data-parallel plan (below 1: pipelining wins).",
    )
    title = "Log-n all-reduce model vs pipelining"
    if not rows:
        return Section(
            title=title,
            paragraphs=paragraphs
            + ("This scenario's node counts are all single-node: nothing crosses the network.",),
        )
    keys = (
        "seed_relative",
        "calibrated_hierarchical",
        "calibrated_step",
        "gradient_GB",
        "hierarchical_allreduce_s",
        "flat_allreduce_s",
    )
    fig = Figure(
        name="seed_argument",
        title="The log-n all-reduce model beside the calibrated models",
        caption="Relative costs at each node count: the log-n model, the calibrated all-reduce "
        "models and the calibrated step time (missing points: no fitting candidate of that kind).",
        png=figures.seed_argument(rows, "Log-n all-reduce model vs calibrated models"),
    )
    table = Table(
        columns=(
            "nodes",
            "log-n model relative",
            "hierarchical / flat all-reduce",
            "pipelined / pure-DP step",
            "gradients GB",
            "hierarchical all-reduce s",
            "flat all-reduce s",
        ),
        rows=tuple((r["nodes"], *(r.get(k) for k in keys)) for r in rows),
    )
    return Section(title=title, paragraphs=paragraphs, tables=(table,), figures=(fig,))
