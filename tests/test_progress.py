"""The spinner: only on a terminal, only after its delay, with the step's name."""

import io
import sys
import time

from planner import progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_nothing_is_written_off_a_terminal(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with progress.working("tracing", delay_s=0.0) as step:
        time.sleep(0.2)
        step("writing")
    assert err.getvalue() == ""


def test_a_terminal_sees_the_step_after_the_delay_and_nothing_for_quick_work(monkeypatch):
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    with progress.working("quick step", delay_s=5.0):
        pass
    assert "quick step" not in err.getvalue()
    with progress.working("tracing the factory", delay_s=0.0):
        time.sleep(0.5)
    assert "tracing the factory" in err.getvalue()
