"""`planner report (PLAN.json | MODEL --hardware HW --gpus N [...]) --out DIR`: the best-practice report.

Writes DIR/report.html (self-contained, figures embedded), DIR/report.md (figures in DIR/figures/)
and DIR/report.json, each atomically. DIR/.planner-report.json lists what the report wrote: only those
files are ever replaced or removed; a report.html/.md/.json or figure it did not write is refused in
one line (exit 2) unless --force is given (planner.report.render).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.commands.common import (MAX_TOKENS, MAX_WORLD_SIZE, FrameworkOpt, GlobalBatchOpt, GpusOpt, HwPrecisionOpt,
                                     NodesOpt, OptimizerOpt, SeqOpt, objective_help)
from planner.errors import ConfigError
from planner.option_rules import check_options

PlanOrModelArg = Annotated[str, typer.Argument(
    help="A plan JSON file (recommend --out / estimate --json), or a MODEL: catalog name, Hugging Face "
         "config.json path, or package.module:factory.")]


def report(
    plan_or_model: PlanOrModelArg,
    out: Annotated[Path, typer.Option("--out", help="Directory for report.html, report.md and figures/.")],
    hardware: Annotated[Optional[str], typer.Option("--hardware", help="Hardware profile name or path (MODEL form).")] = None,
    gpus: GpusOpt = None,
    nodes: NodesOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq: SeqOpt = None,
    precision: HwPrecisionOpt = None,
    optimizer: OptimizerOpt = "adamw",
    framework: Annotated[Optional[str], typer.Option(
        "--framework", help="Software stack: megatron (default), torchtitan, fsdp or deepspeed; with a PLAN.json, "
                            "the plan's own framework unless given.")] = None,
    objective: Annotated[str, typer.Option("--objective", help=objective_help("--train-tokens"))] = "throughput",
    top: Annotated[int, typer.Option("--top", min=0, max=20, help="Runners-up to show.")] = 3,
    train_tokens: Annotated[float, typer.Option("--train-tokens", min=1.0, max=MAX_TOKENS,
                                                help="Tokens of the whole run, for time to train and cost "
                                                     "(default 300e9, as GPT-3).")] = 300e9,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="With a PLAN.json: the MODEL to re-evaluate it with (default: the plan's model name).")] = None,
    scaling_nodes: Annotated[Optional[str], typer.Option(
        "--scaling-nodes", help="Comma-separated node counts for the scaling study (default: around N).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite report.html/.md/.json and figures in DIR that an earlier report did not write "
                        "(other files are never touched).")] = False,
) -> None:
    """Write the best-practice report: plan, breakdowns, timeline, Pareto front, scaling, checklist."""
    from planner.report.build import Scenario, build_report
    from planner.report.render import prepare_report_dir, write_report

    from planner.search import OBJECTIVES

    if objective not in OBJECTIVES:                  # the set recommend ranks by (planner.search, the owner)
        raise ConfigError("objective", objective, "one of " + ", ".join(OBJECTIVES))
    prepare_report_dir(out, force=force)           # before the search: a refused --out costs nothing
    document = _plan_document(plan_or_model)
    counts = _node_list(scaling_nodes)
    if document is not None:
        p, h = document["plan"], document["hardware"]
        scenario = Scenario(model=model or document["model"]["name"], hardware=hardware or h["name"], gpus=h["gpus"],
                            global_batch=p["global_batch"], seq=p["seq"], precision=p["precision"],
                            optimizer=p.get("optimizer", optimizer), objective=objective, top=top,
                            train_tokens=train_tokens, scaling_nodes=counts,
                            framework=framework or p.get("framework", "megatron"))
    else:
        if model is not None:
            raise ConfigError("--model", model, "only with a PLAN.json (a MODEL argument is given already)")
        if plan_or_model.endswith(".json"):
            # a missing or malformed JSON file: say so (as a plan or config.json) before asking for --hardware
            from planner.sources import resolve_model
            resolve_model(plan_or_model)
        if hardware is None:
            raise ConfigError("--hardware", None, "a hardware profile name or path (required with a MODEL)")
        from hardware_profiles import load_profile
        from planner.commands.estimate import world_size
        from cost_models.compute import resolve_precision
        from planner.sources import default_framework
        profile = load_profile(hardware)
        precision = resolve_precision(profile, precision)
        scenario = Scenario(model=plan_or_model, hardware=hardware, gpus=world_size(profile, gpus, nodes),
                            global_batch=global_batch, seq=seq, precision=precision, optimizer=optimizer,
                            objective=objective, top=top, train_tokens=train_tokens, scaling_nodes=counts,
                            framework=default_framework(plan_or_model, framework))
    from hardware_profiles import load_profile

    profile = load_profile(scenario.hardware)
    check_options(framework=framework, objective=objective, hardware=scenario.hardware,
                  price=profile.price_usd_per_hour)
    content = build_report(scenario, plan_document=document)
    html_path, md_path = write_report(content, out, force=force)
    typer.echo(f"wrote {html_path} and {md_path} ({len(content.figures)} figures, "
               f"{len(content.checklist)} checklist rules)", err=True)


def _plan_document(arg: str) -> dict | None:
    """The validated plan document if `arg` is a plan file (a JSON object with 'plan' and 'prediction'),
    None for a MODEL (a config.json is read by the model resolver)."""
    path = Path(arg)
    if not (arg.endswith(".json") and path.exists()):
        return None
    from planner.io import read_json

    document = read_json(path, "report input")
    if ("plan" in document and "prediction" in document) or isinstance(document.get("best"), dict):
        from planner.plan import plan_from_document

        return dict(plan_from_document(document, source=str(path)).document)
    return None


MAX_SCALING_POINTS = 32
"""Node counts in one scaling study (each is a full search)."""


def _node_list(text: str | None) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): at most MAX_SCALING_POINTS counts from 1 to MAX_WORLD_SIZE."""
    if not text:
        return ()
    allowed = (f"up to {MAX_SCALING_POINTS} comma-separated node counts from 1 to {MAX_WORLD_SIZE}, e.g. 1,2,4,8")
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError("--scaling-nodes", text, allowed) from None
    if not counts or min(counts) < 1 or max(counts) > MAX_WORLD_SIZE or len(counts) > MAX_SCALING_POINTS:
        raise ConfigError("--scaling-nodes", text, allowed)
    return counts
