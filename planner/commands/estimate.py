"""`planner estimate` (being built; see the open issue)."""
from __future__ import annotations

import typer

from planner.errors import ConfigError


def estimate(args: list[str] = typer.Argument(None)) -> None:
    """Not available yet in this build."""
    raise ConfigError("command", "estimate", "a command of this build; 'estimate' is not built yet")
