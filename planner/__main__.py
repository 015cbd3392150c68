"""`python -m planner` and the `planner` script: a stop signal is one line and 128 + its number from
the first import on (the imports of planner.cli take seconds on a loaded machine; planner.cli.main
handles the rest), and an output a command can never write is refused before those imports.

`calibrate --out /dev/zero` (or a FIFO, a directory, a missing folder, a JSON array) was refused only
after planner.cli and its packages had loaded: 0.9 s of CPU, 7-21 s of wall time with both cores
busy (issue 31). `early_refusal` makes the command's own check (the same function, the same
message) with only the standard library, planner.io and hardware_profiles loaded; the command
repeats it."""

from __future__ import annotations

import os
import sys

from hardware_profiles.loader import previous_profile
from planner.errors import PlannerError
from planner.executor.lifecycle import Interrupted, stop_signals

EARLY_OUTPUTS = {("hardware", "calibrate"): ("--out", previous_profile)}
"""Commands whose output file is checked before planner.cli loads: (group, command) -> (option,
the command's own check of it, which needs nothing heavier than the standard library)."""


def _option_value(args: list[str], option: str) -> str | None:
    """The last value given to `option` (`--out X` or `--out=X`) before a `--`; None without one."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(option + "="):
            value = arg[len(option) + 1 :]
    return value


def early_refusal(args: list[str]) -> PlannerError | None:
    """The error of an output `args` names that the command would refuse (for calibrate
    hardware_profiles.loader.previous_profile: a device, a FIFO, a directory, a missing or read-only
    folder, a file that is not a hardware profile), for the commands of EARLY_OUTPUTS; None
    otherwise, and whenever the line asks for help or a traceback (the full path then reports it,
    with its trace)."""
    if any(a in ("--help", "-h", "--traceback") for a in args) or os.environ.get(
        "PLANNER_TRACEBACK", ""
    ) not in ("", "0"):
        return None
    words = [
        a
        for i, a in enumerate(args)
        if not a.startswith("-") and (i == 0 or args[i - 1] != "--profile-timeout-s")
    ]
    option, check = EARLY_OUTPUTS.get(tuple(words[:2]), (None, None))
    value = _option_value(args, option) if option else None
    if not value:
        return None
    try:
        check(value, option)
    except PlannerError as err:
        return err
    return None


def main() -> None:
    with stop_signals():
        try:
            refused = early_refusal(sys.argv[1:])
            if refused is not None:
                sys.stderr.write(f"error: {refused}\n")
                sys.exit(refused.exit_code)
            from planner.cli import main as cli_main
        except Interrupted as stop:
            sys.stderr.write(f"error: {stop}\n")
            sys.exit(stop.exit_code)
        cli_main()


if __name__ == "__main__":
    main()
