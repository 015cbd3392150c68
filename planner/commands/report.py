"""`planner report` (being built; see the open issue)."""
from __future__ import annotations

import typer

from planner.errors import ConfigError


def report(args: list[str] = typer.Argument(None)) -> None:
    """Not available yet in this build."""
    raise ConfigError("command", "report", "a command of this build; 'report' is not built yet")
