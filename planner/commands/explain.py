"""`planner explain` (being built; see the open issue)."""
from __future__ import annotations

import typer

from planner.errors import ConfigError


def explain(args: list[str] = typer.Argument(None)) -> None:
    """Not available yet in this build."""
    raise ConfigError("command", "explain", "a command of this build; 'explain' is not built yet")
