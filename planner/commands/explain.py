"""`planner explain PLAN.json [--search] [--json] [--timeline FILE]`: where the time and memory go,
and why the plan won."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.commands.common import JsonOpt, PlanArg, emit_json
from planner.errors import ConfigError
from planner.io import check_writable, write_bytes
from planner.explain import explain_document, research
from planner.plan import load_plan

SearchOpt = Annotated[
    bool,
    typer.Option(
        "--search",
        help="Re-run the search for the plan's model, hardware and "
        "batch, and compare the plan with what it finds.",
    ),
]


TimelineOpt = Annotated[
    Path | None,
    typer.Option(
        "--timeline",
        metavar="FILE",
        help="Draw the plan's simulated step to FILE (.png or .svg): per pipeline stage "
        "its compute and its data-parallel stream, exposed communication in red.",
    ),
]
TIMELINE_FORMATS = (".png", ".svg")


def explain(
    plan: PlanArg,
    search: SearchOpt = False,
    json_out: JsonOpt = False,
    timeline: TimelineOpt = None,
) -> None:
    """Where the step time and the memory go, and why the runner-up lost."""
    if timeline is not None:
        if timeline.suffix.lower() not in TIMELINE_FORMATS:
            raise ConfigError("--timeline", str(timeline), "a file name ending in .png or .svg")
        check_writable(timeline, "--timeline", inputs=((plan, "plan file"),))
    document = dict(load_plan(plan).document)
    if timeline is not None:
        draw_timeline(document, timeline)
    if search:
        document = research(document)
    result = explain_document(document)
    if json_out:
        emit_json({"headline": result.headline, **result.data, "versus": list(result.versus_lines)})
    else:
        typer.echo(result.text())


def draw_timeline(document: dict, path: Path) -> None:
    """Write the plan's simulated step as a figure (planner.report.figures.step_timeline)."""
    # optional heavy dependency: planner.report.figures imports matplotlib at its top
    from planner.report import backend, figures  # matplotlib: loaded when a figure is asked for

    step = backend.step_timeline(document)
    title = backend.step_title(document, step)
    data = figures.step_timeline(step, title, fmt=path.suffix.lower().lstrip("."))
    write_bytes(path, data, "--timeline")
    typer.echo(f"wrote {path}", err=True)
