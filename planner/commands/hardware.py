"""`planner hardware` (being built; see the open issue)."""
from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="List, show and calibrate hardware profiles.")


@app.command("list")
def list_() -> None:
    """Not available yet in this build."""
    raise typer.Exit(2)
