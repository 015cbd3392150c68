"""Process lifetime: ranks die with their launcher, and the launcher stops its ranks when it is told to stop.

- `die_with_parent()` (in each rank, first thing): Linux's prctl(PR_SET_PDEATHSIG, SIGKILL) makes the
  kernel kill the rank when the process that started it exits, however it exits (SIGKILL included);
  `parent_alive()` is the portable fallback the rank's heartbeat thread polls (a re-parented process
  has a new parent pid).
- `run_as_rank()` (a spawned rank's multiprocessing target) arms the parent-death signal before any
  heavy import, ignores SIGINT (a Ctrl-C to the process group is the launcher's to handle: it stops
  every rank and prints one line), then runs the rank's function; `starting_ranks()` (in the
  launcher, around `Process.start`) blocks SIGINT so the ranks start with it blocked until then.
- `stop_signals()` (in the launcher, around the launch): SIGTERM (timeout, Slurm, Kubernetes), SIGINT
  (Ctrl-C) and SIGHUP (a closed terminal) raise `Interrupted` in the launcher's main thread, so it
  leaves its watch loop through the code that stops every rank, then exits 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import signal
import sys


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
"""prctl option number (linux/prctl.h)."""


class Interrupted(BaseException):
    """The launcher was told to stop; every rank has been stopped. Exit 128 + signal (shell
    convention).
    A BaseException, as KeyboardInterrupt: no `except Exception` or `except PlannerError` on the way
    (a fallback, a library's retry) may swallow a stop and let the command finish with exit 0."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")


def die_with_parent(expected_parent: int | None = None) -> int:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux; elsewhere a no-op).
    Returns the parent pid to poll. If the parent is already gone (it died between fork and this
    call, and the process was re-parented), exit now."""
    parent = expected_parent if expected_parent is not None else os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the heartbeat thread's parent poll still ends the rank
    if os.getppid() != parent:
        os._exit(1)
    return parent


def parent_alive(parent: int) -> bool:
    """False once this process was re-parented (its launcher died)."""
    return os.getppid() == parent


@contextlib.contextmanager
def stop_signals():
    """Turn the first SIGTERM/SIGINT/SIGHUP into `Interrupted` in the main thread while the block runs;
    later ones are ignored until the block ends, so stopping the ranks is not cut short (it is
    bounded: SIGTERM, then SIGKILL after a grace period)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be installed from the main thread (e.g. a test runner's worker)
        return

    def handler(signum, frame):
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            continue  # ignored by who started us (nohup, a shell's background job)
        try:
            previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def default_signals() -> None:
    """In a forked rank: the default action for the stop signals (the launcher's handlers are inherited)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def run_as_rank(launcher: int, target: str, *args) -> None:
    """Entry of a spawned rank: die with `launcher`, ignore SIGINT, then call `target`
    ('package.module:function') with `args`. Its module is imported only now, so a launcher killed
    while its ranks import torch takes them with it. Pass plain arguments: unpickling them runs
    before this function."""
    die_with_parent(launcher)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    module, name = target.split(":")
    getattr(importlib.import_module(module), name)(*args)


@contextlib.contextmanager
def starting_ranks():
    """Block SIGINT in the launcher while it starts its ranks: the signal mask survives fork and
    exec, so a rank starts with SIGINT blocked (no KeyboardInterrupt in its start-up imports) until
    `run_as_rank` ignores it; the launcher receives a SIGINT sent meanwhile when the block ends."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
