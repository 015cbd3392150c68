"""`planner export` (being built; see the open issue)."""
from __future__ import annotations

import typer

from planner.errors import ConfigError


def export(args: list[str] = typer.Argument(None)) -> None:
    """Not available yet in this build."""
    raise ConfigError("command", "export", "a command of this build; 'export' is not built yet")
