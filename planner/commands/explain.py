"""`planner explain PLAN.json [--search] [--json]`: where the time and memory go, and why the plan won."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.commands.common import JsonOpt, PlanArg, emit_json

SearchOpt = Annotated[
    bool,
    typer.Option(
        "--search",
        help="Re-run the search for the plan's model, hardware and "
        "batch, and compare the plan with what it finds.",
    ),
]


def explain(plan: PlanArg, search: SearchOpt = False, json_out: JsonOpt = False) -> None:
    """Where the step time and the memory go, and why the runner-up lost."""
    from planner.explain import explain_document, research
    from planner.plan import load_plan

    document = dict(load_plan(plan).document)
    if search:
        document = research(document)
    result = explain_document(document)
    if json_out:
        emit_json({"headline": result.headline, **result.data, "versus": list(result.versus_lines)})
    else:
        typer.echo(result.text())
