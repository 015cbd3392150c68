"""`python -m planner`: a stop signal is one line and 128 + its number from the first import on (the
imports of planner.cli take seconds on a loaded machine; planner.cli.main handles the rest)."""

import sys

from planner.executor.lifecycle import Interrupted, stop_signals

with stop_signals():
    try:
        from planner.cli import main
    except Interrupted as stop:
        sys.stderr.write(f"error: {stop}\n")
        sys.exit(stop.exit_code)
    main()
