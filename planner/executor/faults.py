"""Faults: heartbeats from the workers, a parent that watches exit codes and progress, and a
bounded stop. A rank that dies is seen at once (its exit code); one that hangs makes its peers'
collectives fail after the process-group timeout, or stalls every heartbeat past `stall_s`; either
way the parent stops every rank (SIGTERM, then SIGKILL) and names the culprit in one line.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from planner.executor import ExecutorError


class Heartbeat:
    """A worker's progress file: `heartbeat-RANK.json` = {"phase", "step", "time"}."""

    def __init__(self, directory: str | Path | None, rank: int):
        self.path = Path(directory) / f"heartbeat-{rank}.json" if directory else None

    def beat(self, phase: str, step: int = -1) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"phase": phase, "step": step, "time": time.time()}))
        os.replace(tmp, self.path)


def read_heartbeat(directory: Path, rank: int) -> dict | None:
    try:
        return json.loads((directory / f"heartbeat-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def inject_fault(fault: str | None, rank: int, step: int) -> None:
    """Test hook 'kill:RANK:STEP' (SIGKILL itself) or 'hang:RANK:STEP' (sleep forever) at a step's start."""
    if not fault:
        return
    kind, fault_rank, fault_step = fault.split(":")
    if int(fault_rank) != rank or int(fault_step) != step:
        return
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "hang":
        while True:
            time.sleep(3600)


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    rank: int
    returncode: int | None
    """Exit code (negative: killed by that signal); None when the rank was stalled, not dead."""
    message: str


def _describe(rank: int, code: int, workdir: Path) -> str:
    beat = read_heartbeat(workdir, rank) or {}
    where = f"during step {beat['step']}" if beat.get("step", -1) >= 0 else f"during {beat.get('phase', 'startup')}"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name} {where}"
    try:
        err = json.loads((workdir / f"error-{rank}.json").read_text())["message"]
    except (OSError, ValueError, KeyError):
        err = f"exit code {code}"
    return f"rank {rank} failed {where}: {err}"


def _stalest_live_rank(procs: list[subprocess.Popen], workdir: Path, *, exclude: int) -> str:
    """', rank R (alive, last heartbeat N s ago at step S) looks hung' for the live rank that has
    been silent longest, when it has been silent for over 2 s; '' otherwise."""
    now, best = time.time(), None
    for r, p in enumerate(procs):
        beat = read_heartbeat(workdir, r)
        if r == exclude or p.poll() is not None or beat is None:
            continue
        age = now - beat["time"]
        if age > 2.0 and (best is None or age > best[1]):
            best = (r, age, beat.get("step", -1))
    if best is None:
        return ""
    return f" (rank {best[0]} is alive but silent for {best[1]:.0f} s since step {best[2]}: it looks hung)"


def stop_all(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """SIGTERM every live worker's process group, SIGKILL what is left after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def watch(procs: list[subprocess.Popen], workdir: Path, *, stall_s: float, poll_s: float = 0.2) -> None:
    """Return when every worker exited 0; otherwise stop them all and raise one clear ExecutorError."""
    world = len(procs)
    started = time.time()
    while True:
        codes = [p.poll() for p in procs]
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            # a signal death is the cause, peers' connection errors are the consequence
            rank, code = min(bad, key=lambda rc: (rc[1] >= 0, rc[0]))
            t_fail = time.monotonic()
            suspect = _stalest_live_rank(procs, workdir, exclude=rank)
            stop_all(procs)
            raise ExecutorError(f"{_describe(rank, code, workdir)}{suspect}; stopped all {world} ranks "
                                f"({time.monotonic() - t_fail:.1f} s after the failure). Logs: {workdir}")
        if all(c == 0 for c in codes):
            return
        now = time.time()
        beats = [read_heartbeat(workdir, r) for r in range(world)]
        last = [b["time"] if b else started for b in beats]
        if now - max(last) > stall_s:
            rank = min(range(world), key=lambda r: (beats[r] or {}).get("step", -1))
            step = (beats[rank] or {}).get("step", -1)
            stop_all(procs)
            raise ExecutorError(f"no rank made progress for {stall_s:.0f} s (rank {rank} is furthest behind, at "
                                f"step {step}): stopped all {world} ranks. Logs: {workdir}")
        time.sleep(poll_s)
