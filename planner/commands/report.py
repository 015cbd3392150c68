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

from planner.commands.common import (
    MAX_WORLD_SIZE,
    FrameworkOpt,
    GlobalBatchOpt,
    GpusOpt,
    HwPrecisionOpt,
    NodesOpt,
    OptimizerOpt,
    SeqOpt,
    objective_help,
)
from planner.commands.recommend import (
    TOKENS_HELP,
    CpOpt,
    DpShardOpt,
    EpOpt,
    PriceOpt,
    SpotOpt,
    TopOpt,
    check_price,
    parse_tokens,
    search_space,
)
from planner.errors import ConfigError
from planner.option_rules import check_options
from planner.progress import working
from hardware_profiles import load_profile
from planner.commands.estimate import world_size
from planner.io import read_json
from planner.plan import plan_from_document
from planner.report.render import prepare_report_dir, write_report
from planner.search import OBJECTIVES
from planner.sources import default_framework, resolve_model
from cost_models.compute import resolve_precision

ReportTokensOpt = Annotated[str, typer.Option("--tokens", help=TOKENS_HELP)]

PlanOrModelArg = Annotated[
    str,
    typer.Argument(
        help="A plan JSON file (recommend --out / estimate --json), or a MODEL: catalog name, Hugging Face "
        "config.json path, or package.module:factory."
    ),
]


def report(
    plan_or_model: PlanOrModelArg,
    out: Annotated[
        Path, typer.Option("--out", help="Directory for report.html, report.md and figures/.")
    ],
    hardware: Annotated[
        Optional[str],
        typer.Option("--hardware", help="Hardware profile name or path (MODEL form)."),
    ] = None,
    gpus: GpusOpt = None,
    nodes: NodesOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq: SeqOpt = None,
    precision: HwPrecisionOpt = None,
    optimizer: OptimizerOpt = "adamw",
    framework: FrameworkOpt = None,
    objective: Annotated[
        str, typer.Option("--objective", help=objective_help("--tokens"))
    ] = "throughput",
    top: TopOpt = 4,
    tokens: ReportTokensOpt = "300B",
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            help="With a PLAN.json: the MODEL to re-evaluate it with (default: the plan's model name).",
        ),
    ] = None,
    scaling_nodes: Annotated[
        Optional[str],
        typer.Option(
            "--scaling-nodes",
            help="Comma-separated node counts for the scaling study (default: around N).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Overwrite report.html/.md/.json and figures in DIR that an earlier report did not write "
            "(other files are never touched).",
        ),
    ] = False,
    cp: CpOpt = None,
    ep: EpOpt = None,
    dp_shard: DpShardOpt = None,
    price_per_hour: PriceOpt = None,
    spot: SpotOpt = False,
) -> None:
    """Write the best-practice report: plan, breakdowns, timeline, Pareto front, scaling, checklist."""
    # optional heavy dependency: planner.report.build imports matplotlib at its top
    from planner.report.build import Scenario, build_report

    if objective not in OBJECTIVES:  # the set recommend ranks by (planner.search, the owner)
        raise ConfigError("objective", objective, "one of " + ", ".join(OBJECTIVES))
    train_tokens = parse_tokens(tokens)
    check_price(price_per_hour)
    space = search_space(cp=cp, dp_shard=dp_shard, ep=ep)
    options = dict(
        objective=objective,
        top=top - 1,
        train_tokens=train_tokens,
        price_per_hour=price_per_hour,
        spot=spot,
        space=space,
    )
    prepare_report_dir(out, force=force)  # before the search: a refused --out costs nothing
    document = _plan_document(plan_or_model)
    counts = _node_list(scaling_nodes)
    if document is not None:
        fields = _plan_fields(
            document, model=model, hardware=hardware, framework=framework, optimizer=optimizer
        )
    else:
        fields = _model_fields(
            plan_or_model, model=model, hardware=hardware, gpus=gpus, nodes=nodes,
            global_batch=global_batch, seq=seq, precision=precision, optimizer=optimizer,
            framework=framework,
        )  # fmt: skip
    scenario = Scenario(**fields, scaling_nodes=counts, **options)

    profile = load_profile(scenario.hardware)
    check_options(
        framework=framework,
        objective=objective,
        hardware=scenario.hardware,
        price=price_per_hour or profile.price_usd_per_hour,
    )
    with working("report: searching, the scaling study and the checklist's what-ifs") as step:
        content = build_report(scenario, plan_document=document)
        step("report: drawing the figures and writing the files")
        html_path, md_path = write_report(content, out, force=force)
    typer.echo(
        f"wrote {html_path} and {md_path} ({len(content.figures)} figures, "
        f"{len(content.checklist)} checklist rules)",
        err=True,
    )


def _plan_fields(document: dict, *, model, hardware, framework, optimizer) -> dict:
    """The report's scenario for a plan file: its model, hardware and batch unless flags say
    otherwise."""
    p, h = document["plan"], document["hardware"]
    return dict(
        model=model or document["model"]["name"],
        hardware=hardware or h["name"],
        gpus=h["gpus"],
        global_batch=p["global_batch"],
        seq=p["seq"],
        precision=p["precision"],
        optimizer=p.get("optimizer", optimizer),
        framework=framework or p.get("framework", "megatron"),
    )


def _model_fields(
    plan_or_model: str, *, model, hardware, gpus, nodes, precision, framework, **batch
) -> dict:
    """The report's scenario for a MODEL argument, which needs --hardware (and takes no --model);
    `batch`: global_batch, seq and optimizer as given."""
    if model is not None:
        raise ConfigError(
            "--model", model, "only with a PLAN.json (a MODEL argument is given already)"
        )
    if plan_or_model.endswith(".json"):
        # a missing or malformed JSON file: say so (as a plan or config.json) before asking for --hardware
        resolve_model(plan_or_model)
    if hardware is None:
        raise ConfigError(
            "--hardware", None, "a hardware profile name or path (required with a MODEL)"
        )
    profile = load_profile(hardware)
    return dict(
        model=plan_or_model,
        hardware=hardware,
        gpus=world_size(profile, gpus, nodes),
        precision=resolve_precision(profile, precision),
        framework=default_framework(plan_or_model, framework),
        **batch,
    )


def _plan_document(arg: str) -> dict | None:
    """The validated plan document if `arg` is a plan file (a JSON object with 'plan' and 'prediction'),
    None for a MODEL (a config.json is read by the model resolver)."""
    path = Path(arg)
    if not (arg.endswith(".json") and path.exists()):
        return None

    document = read_json(path, "report input")
    if ("plan" in document and "prediction" in document) or isinstance(document.get("best"), dict):
        return dict(plan_from_document(document, source=str(path)).document)
    return None


MAX_SCALING_POINTS = 32
"""Node counts in one scaling study (each is a full search)."""


def _node_list(text: str | None) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): at most MAX_SCALING_POINTS counts from 1 to MAX_WORLD_SIZE."""
    if not text:
        return ()
    allowed = f"up to {MAX_SCALING_POINTS} comma-separated node counts from 1 to {MAX_WORLD_SIZE}, e.g. 1,2,4,8"
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError("--scaling-nodes", text, allowed) from None
    if (
        not counts
        or min(counts) < 1
        or max(counts) > MAX_WORLD_SIZE
        or len(counts) > MAX_SCALING_POINTS
    ):
        raise ConfigError("--scaling-nodes", text, allowed)
    return counts
