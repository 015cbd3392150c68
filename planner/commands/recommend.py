"""`planner recommend` (being built; see the open issue)."""
from __future__ import annotations

import typer

from planner.errors import ConfigError


def recommend(args: list[str] = typer.Argument(None)) -> None:
    """Not available yet in this build."""
    raise ConfigError("command", "recommend", "a command of this build; 'recommend' is not built yet")
