"""The `planner` command line: a thin typer shell over library calls.

Each command lives in `planner/commands/<name>.py`; this module joins them and turns every
`PlannerError` into one line on stderr with its exit code (2 bad input, 3 nothing fits).

Global options, accepted anywhere on the command line (they are moved in front of the command
before parsing): `--traceback` (also PLANNER_TRACEBACK=1) prints the full trace above the one-line
error (for a failing `package.module:factory`, the trace of the user's exception);
`--profile-timeout-s S` limits importing, building and tracing a factory (planner.usercode).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
import warnings
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from planner.errors import PlannerError
from planner.executor.lifecycle import Interrupted, stop_signals
from planner.usercode import set_timeout_s, timeout_s


try:  # typer >= 0.29 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer depends on click
    from click.exceptions import ClickException


def _usage_exit(err: ClickException) -> typer.Exit:
    """Print one line for an option/argument error typer found (bad value, missing argument, unknown
    option) and return the exit that carries its code."""
    ctx = getattr(err, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None and ctx.command_path else ""
    typer.echo(f"error: {where}{' '.join(err.format_message().split())} (see --help)", err=True)
    return typer.Exit(err.exit_code)


GLOBAL_FLAGS = ("--traceback",)
GLOBAL_OPTIONS = ("--profile-timeout-s",)
_NUMPY_FP_WARNINGS = r"(divide by zero|invalid value|overflow) encountered"
"""numpy's floating-point RuntimeWarnings: a non-finite result is reported as one error line instead
(planner.io.dumps_strict, planner.search.non_finite_error)."""


def hoist_global_options(args: list[str]) -> list[str]:
    """Move the global options (GLOBAL_FLAGS, GLOBAL_OPTIONS with their value) in front of the
    command, so that `planner profile m:f --traceback` means `planner --traceback profile m:f`;
    nothing after a `--` moves.

    >>> hoist_global_options(["profile", "m:f", "--traceback", "--profile-timeout-s", "5", "--", "--traceback"])
    ['--traceback', '--profile-timeout-s', '5', 'profile', 'm:f', '--', '--traceback']
    """
    front, rest, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in GLOBAL_FLAGS or any(arg.startswith(f"{o}=") for o in GLOBAL_OPTIONS):
            front.append(arg)
        elif arg in GLOBAL_OPTIONS and i + 1 < len(args):
            front += [arg, args[i + 1]]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return front + rest


def _wants_traceback(ctx) -> bool:
    return bool(ctx.params.get("traceback")) or os.environ.get("PLANNER_TRACEBACK", "") not in (
        "",
        "0",
    )


COMMANDS = {
    "models": (
        "models",
        "The catalog's models: parameters, blocks, width, heads, experts, default sequence and "
        "source (MODEL names).",
    ),
    "profile": (
        "profile",
        "Parameters, FLOPs and activation bytes per layer for one micro-batch, on a framework's "
        "kernels (with the run options estimate takes, the same bytes estimate reports).",
    ),
    "estimate": (
        "estimate",
        "Predict step time and peak memory of one parallel configuration.",
    ),
    "recommend": (
        "recommend",
        "Search every parallel strategy, rank by the objective and print the top plans.",
    ),
    "explain": (
        "explain",
        "Where the step time and the memory go, and why the runner-up lost.",
    ),
    "export": (
        "export",
        "Translate a plan into a torchtitan, Megatron-LM, Accelerate FSDP, DeepSpeed or SageMaker "
        "configuration (notes on stderr).",
    ),
    "run": (
        "run",
        "Run PLAN.json for real: per-rank step times beside the prediction, optionally verified.",
    ),
    "report": (
        "report",
        "Write the best-practice report: plan, breakdowns, timeline, Pareto front, scaling, "
        "checklist.",
    ),
    "hardware": ("app", "List, show and calibrate hardware profiles."),
}
"""The commands, in --help order: name -> (what planner/commands/<name>.py defines for it: the
command's function or, for a group, its Typer app; the first paragraph of its help, which the root
--help lists). Only the command a line names is imported (`load_command`): a command module imports
what it runs at its top, and `planner --help` or `planner models` loads none of the others
(tests/test_cli_basics.py checks that each summary is the command's own)."""


def load_command(name: str):
    """The click command `name` of COMMANDS, built by typer from planner/commands/<name>.py as the
    root group would build it."""
    attr, _ = COMMANDS[name]
    # the one lazy import of the command line: the chosen command's module, so that each command
    # module can import what it runs at its top without every command paying for all of them
    target = getattr(importlib.import_module(f"planner.commands.{name}"), attr)
    stage = typer.Typer(add_completion=False, rich_markup_mode=None)
    if isinstance(target, typer.Typer):
        stage.add_typer(target, name=name)
    else:
        stage.command(name)(target)
    return typer.main.get_group(stage).commands[name]


class _Unloaded(TyperCommand):
    """A command of COMMANDS not imported yet: its name and summary, for the root --help and the
    'Did you mean' of a mistyped name."""


class _PlannerGroup(TyperGroup):
    """Root group: user errors become one line and an exit code, never a traceback or a boxed
    usage message. Its commands are imported when the line names them (COMMANDS)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, (_, summary) in COMMANDS.items():
            self.commands.setdefault(name, _Unloaded(name=name, help=summary))
        self._listing = False

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if isinstance(cmd, _Unloaded) and not self._listing:
            cmd = self.commands[cmd_name] = load_command(cmd_name)
        return cmd

    def format_commands(self, ctx, formatter):
        self._listing = True  # the summaries of COMMANDS, without importing every command
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False

    def make_context(self, info_name, args, parent=None, **extra):
        if parent is None:
            args = hoist_global_options(list(args))
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except ClickException as err:
            raise _usage_exit(err) from None

    def invoke(self, ctx):
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", _NUMPY_FP_WARNINGS, RuntimeWarning)
                return super().invoke(ctx)
        except (PlannerError, Interrupted) as err:
            raise _error_exit(ctx, err, str(err), err.exit_code) from None
        except ClickException as err:
            raise _usage_exit(err) from None
        except OverflowError as err:
            # only absurd input sizes reach it (e.g. a config.json with hidden_size 1e20): name it as input
            raise _error_exit(
                ctx,
                err,
                f"a number in the input is too large to compute with ({err}); check the "
                f"model's sizes and the command's numbers",
                2,
            ) from None


def _error_exit(ctx, err: BaseException, line: str, code: int) -> typer.Exit:
    """Print `line` as the one error line (with --traceback, the full trace above it: for a failing
    package.module:factory, the trace of the user's exception) and return the exit."""
    if _wants_traceback(ctx):
        typer.echo(
            getattr(err, "trace", None) or "".join(traceback.format_exception(err)),
            err=True,
            nl=False,
        )
    typer.echo(f"error: {line}", err=True)
    return typer.Exit(code)


app = typer.Typer(
    cls=_PlannerGroup,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Plan, score, run and explain parallel training of large PyTorch models.",
)


@app.callback()
def _global_options(
    traceback: Annotated[
        bool,
        typer.Option(
            "--traceback",
            help="On an error, print the full trace above the one-line message (for a failing "
            "package.module:factory, the trace of its exception). Also PLANNER_TRACEBACK=1.",
        ),
    ] = False,
    profile_timeout_s: Annotated[
        Optional[float],
        typer.Option(
            "--profile-timeout-s",
            help="Seconds allowed for importing, building and tracing a package.module:factory "
            "on the meta device (default 300, or PLANNER_PROFILE_TIMEOUT_S).",
        ),
    ] = None,
) -> None:
    """Plan, score, run and explain parallel training of large PyTorch models."""
    set_timeout_s(profile_timeout_s)
    timeout_s()  # a bad PLANNER_PROFILE_TIMEOUT_S is refused up front


def main() -> None:
    """The `planner` command. SIGTERM, SIGINT and SIGHUP stop it with one line and 128 + the
    signal number wherever they land (a launch's own handler, lifecycle.stop_signals, stops its
    ranks first)."""
    with stop_signals():
        try:
            app(prog_name="planner")
        except Interrupted as stop:  # landed outside a command (typer parsing the line)
            typer.echo(f"error: {stop}", err=True)
            sys.exit(stop.exit_code)


if __name__ == "__main__":
    sys.exit(main())
