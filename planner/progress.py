"""A spinner with the step's name on stderr, for work that may take more than a second or two (a
report's
searches, tracing a factory on the meta device). Only on a terminal: piped or captured stderr gets
nothing, so
scripts and `--json` runs see no change. It appears after `delay_s`, so quick runs print nothing."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

DELAY_S = 1.0
"""Seconds before the spinner appears."""


@contextmanager
def working(step: str, *, delay_s: float = DELAY_S) -> Iterator[Callable[[str], None]]:
    """Show `step` with a spinner on stderr (a terminal only) while the block runs; yields a
    function that renames
    the step."""
    if not sys.stderr.isatty():
        yield lambda _text: None
        return
    from rich.console import Console

    status = Console(stderr=True).status(step)
    lock, state = threading.Lock(), {"done": False}

    def show() -> None:
        with lock:
            if not state["done"]:
                status.start()

    timer = threading.Timer(delay_s, show)
    timer.daemon = True
    timer.start()
    try:
        yield status.update
    finally:
        with lock:
            state["done"] = True
            timer.cancel()
            status.stop()
