"""`planner profile` (being built; see the open issue)."""
from __future__ import annotations

import typer

from planner.errors import ConfigError


def profile(args: list[str] = typer.Argument(None)) -> None:
    """Not available yet in this build."""
    raise ConfigError("command", "profile", "a command of this build; 'profile' is not built yet")
