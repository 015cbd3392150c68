"""The check scripts' request loop: one JSON list of items per stdin line, one `PLANNER-RESULT
<JSON list>` line per request on stdout, until stdin closes.

tests/validators/env.py keeps one process per target for the whole test session, so a framework's
import (5-12 s of CPU for torchtitan and megatron) is paid once, not once per test. Every request
is checked exactly as a single list was: the items of a test meet those of earlier tests in the
process as a long list's items always met each other, and the item index counts on across
requests (files and modules a check writes keep names of their own)."""

from __future__ import annotations

import json
import sys


def serve(check_items) -> None:
    """check_items(items, first_index) -> one result per item."""
    done = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        items = json.loads(line)
        results = check_items(items, done)
        done += len(items)
        sys.stdout.write("PLANNER-RESULT " + json.dumps(results) + "\n")
        sys.stdout.flush()
