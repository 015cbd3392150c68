"""`planner run` (being built; see the open issue)."""
from __future__ import annotations

import typer

from planner.errors import ConfigError


def run(args: list[str] = typer.Argument(None)) -> None:
    """Not available yet in this build."""
    raise ConfigError("command", "run", "a command of this build; 'run' is not built yet")
