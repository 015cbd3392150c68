"""The `planner` command line: a thin typer shell over library calls.

Each command lives in `planner/commands/<name>.py`; this module joins them and turns every
`PlannerError` into one line on stderr with its exit code (2 bad input, 3 nothing fits).
"""
from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from planner.errors import PlannerError


try:                                   # typer >= 0.29 vendors click
    from typer._click.exceptions import ClickException
except ImportError:                    # pragma: no cover - older typer depends on click
    from click.exceptions import ClickException


def _usage_exit(err: ClickException) -> typer.Exit:
    """Print one line for an option/argument error typer found (bad value, missing argument, unknown
    option) and return the exit that carries its code."""
    ctx = getattr(err, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None and ctx.command_path else ""
    typer.echo(f"error: {where}{' '.join(err.format_message().split())} (see --help)", err=True)
    return typer.Exit(err.exit_code)


class _PlannerGroup(TyperGroup):
    """Root group: user errors become one line and an exit code, never a traceback or a boxed
    usage message."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except ClickException as err:
            raise _usage_exit(err) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PlannerError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(err.exit_code) from None
        except ClickException as err:
            raise _usage_exit(err) from None


app = typer.Typer(cls=_PlannerGroup, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False,
                  help="Plan, score, run and explain parallel training of large PyTorch models.")


def _register() -> None:
    from planner.commands import (estimate, explain, export, hardware, profile, recommend, report, run)

    app.command("profile")(profile.profile)
    app.add_typer(hardware.app, name="hardware")
    app.command("estimate")(estimate.estimate)
    app.command("recommend")(recommend.recommend)
    app.command("explain")(explain.explain)
    app.command("export")(export.export)
    app.command("run")(run.run)
    app.command("report")(report.report)


_register()


def main() -> None:
    app(prog_name="planner")


if __name__ == "__main__":
    sys.exit(main())
