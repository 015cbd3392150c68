"""Faults: heartbeats from the workers, a parent that watches exit codes and liveness, and a bounded stop.

A rank that dies is seen at once (its exit code). A rank that hangs inside Python makes its peers'
collectives fail after the process-group timeout. A rank that is frozen (SIGSTOP, a stuck machine)
stops its heartbeat thread too: the parent stops everything once a rank's heartbeat is older than
the same timeout (`--timeout-s`). A rank whose launcher died kills itself (lifecycle.py). Either
way the parent stops every rank (SIGTERM, then SIGKILL) and names the culprit in one line.

Test-only switches (RunSpec.fault, the hidden `--inject-fault` option; never read from a plan):
`kill:RANK:STEP`, `hang:RANK:STEP`, `stop:RANK:STEP` (SIGSTOP itself), `segv:RANK:STEP`
(SIGSEGV itself, as a crash inside native code dies) at the start of a step, and
`bug:NAME`, a real parallelization bug planted in the run so tests can show `--verify` catches it
(BUGS).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from planner.errors import ConfigError
from planner.executor import ExecutorError
from planner.executor.lifecycle import parent_alive

BUGS = {
    "skip_dp_reduce": "data parallelism without the gradient all-reduce (each replica keeps its own gradient)",
    "tp_no_reduce": "RowwiseParallel outputs (attention wo, MLP w2) used as partial sums, never all-reduced",
    "tp_double_reduce": "RowwiseParallel outputs all-reduced a second time over the tp group",
    "drop_microbatch": "the pipeline schedule skips the backward of micro-batch 0",
    "double_microbatch": "micro-batch 1 is a copy of micro-batch 0 (one dropped, one counted twice)",
    "zero_shard_offset": "ZeRO: dp rank 1's optimizer steps its shard with the gradient rows shifted by one",
    "cp_drop_kv_block": "context parallelism's ring attention never uses the last key/value block to arrive",
    "ep_wrong_rank": "expert parallelism dispatches every token to the next ep rank's expert in the same slot",
    "hsdp_skip_replica_reduce": "hybrid sharding: gradients reduce-scattered inside each shard group, never "
    "all-reduced across the replicas",
}
"""Injectable bugs (`bug:NAME`) and what each plants."""

FAULT_KINDS = ("kill", "hang", "stop", "segv")
NATIVE_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)
"""Deaths inside native code: the rank's log holds faulthandler's Python stack of the call
(worker.main)."""
LIVENESS_PERIOD_S = 1.0
"""Heartbeat thread period (shorter for timeouts under 5 s: timeout / 5)."""


def parse_fault(fault: str | None) -> tuple[str, int, int] | tuple[str, str] | None:
    """('kill'|'hang'|'stop', rank, step), ('bug', name) or None; ConfigError names what is allowed."""
    if fault is None:
        return None
    parts = fault.split(":")
    if len(parts) == 2 and parts[0] == "bug" and parts[1] in BUGS:
        return ("bug", parts[1])
    if len(parts) == 3 and parts[0] in FAULT_KINDS and all(p.isdigit() for p in parts[1:]):
        return (parts[0], int(parts[1]), int(parts[2]))
    raise ConfigError(
        "inject-fault",
        fault,
        "kill|hang|stop|segv:RANK:STEP or bug:NAME with NAME one of " + ", ".join(BUGS),
    )


def bug(fault: str | None) -> str | None:
    """The planted bug's name, if the fault is one."""
    parsed = parse_fault(fault)
    return parsed[1] if parsed and parsed[0] == "bug" else None


def check_bug_applies(name: str, config) -> None:
    """A planted bug needs the parallelism it breaks; otherwise the run would be correct (exit 2)."""
    needs = {
        "skip_dp_reduce": (config.dp > 1 and config.zero == 0, "dp > 1 with zero 0"),
        "tp_no_reduce": (
            config.tp > 1 and not config.sequence_parallel,
            "tp > 1 without sequence parallelism",
        ),
        "tp_double_reduce": (config.tp > 1, "tp > 1"),
        "drop_microbatch": (config.pp > 1, "pp > 1"),
        "double_microbatch": (
            config.pp > 1 and config.num_microbatches > 1,
            "pp > 1 and 2+ micro-batches",
        ),
        "zero_shard_offset": (config.dp > 1 and config.zero > 0, "dp > 1 with zero 1, 2 or 3"),
        "cp_drop_kv_block": (config.cp > 1 and config.cp_comm == "p2p", "cp > 1 with cp_comm p2p"),
        "ep_wrong_rank": (config.ep > 1, "ep > 1"),
        "hsdp_skip_replica_reduce": (
            config.zero > 0 and 0 < config.dp_shard < config.dp and config.pp == 1,
            "zero 1, 2 or 3 with 0 < dp_shard < dp and pp 1",
        ),
    }
    ok, what = needs[name]
    if not ok:
        raise ConfigError("inject-fault", f"bug:{name}", f"a plan with {what}")


class Heartbeat:
    """A worker's progress file: `heartbeat-RANK.json` = {"phase", "step", "since", "time", "pid"}:
    `since` is when the phase or step last changed (progress), `time` when the file was last written,
    at every change and, by a background thread, every LIVENESS_PERIOD_S (liveness: a frozen process
    is seen even during a long step). The thread also ends the rank if its launcher died."""

    def __init__(self, directory: str | Path | None, rank: int):
        self.path = Path(directory) / f"heartbeat-{rank}.json" if directory else None
        self.phase, self.step = "init", -1
        self.since = time.time()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def beat(self, phase: str | None = None, step: int | None = None) -> None:
        if phase is not None or step is not None:
            self.phase = phase if phase is not None else self.phase
            self.step = step if step is not None else self.step
            self.since = time.time()
        if self.path is None:
            return
        with self._lock:
            tmp = self.path.with_name(self.path.name + f".{threading.get_ident()}.tmp")
            tmp.write_text(
                json.dumps(
                    {
                        "phase": self.phase,
                        "step": self.step,
                        "since": self.since,
                        "time": time.time(),
                        "pid": os.getpid(),
                    }
                )
            )
            os.replace(tmp, self.path)

    def start(self, *, period_s: float, parent: int | None) -> None:
        """Beat every `period_s` from a daemon thread; SIGKILL this process once `parent` is gone."""

        def loop():
            while True:
                time.sleep(period_s)
                if parent is not None and not parent_alive(parent):
                    os.kill(os.getpid(), signal.SIGKILL)
                try:
                    self.beat()
                except OSError:
                    pass  # the work directory is being removed: the launcher is stopping us

        self._thread = threading.Thread(target=loop, name="planner-heartbeat", daemon=True)
        self._thread.start()


def read_heartbeat(directory: Path, rank: int) -> dict | None:
    try:
        return json.loads((directory / f"heartbeat-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def inject_fault(fault: str | None, rank: int, step: int) -> None:
    """Test hook at a step's start: 'kill' (SIGKILL itself), 'hang' (sleep forever, heartbeat thread
    alive), 'stop' (SIGSTOP itself: frozen, heartbeat thread too)."""
    parsed = parse_fault(fault)
    if not parsed or parsed[0] == "bug":
        return
    kind, fault_rank, fault_step = parsed
    if fault_rank != rank or fault_step != step:
        return
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "hang":
        while True:
            time.sleep(3600)


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    rank: int
    returncode: int | None
    """Exit code (negative: killed by that signal); None when the rank was stalled, not dead."""
    message: str


def native_crash_site(log: Path) -> str | None:
    """Where a rank's native crash hit, from faulthandler's dump in its log: 'function (file:line)'
    of the innermost Python frame of the crashing thread ("Current thread ... (most recent call
    first):"); when the crashing thread has no Python frame (gloo's worker and transport threads,
    OpenMP's: faulthandler then marks no thread current), 'a thread without Python frames (main
    thread in function (file:line))'; None without a dump."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-400:]
    except OSError:
        return None
    starts = [
        i
        for i, line in enumerate(lines)
        if line.startswith("Current thread") or line.startswith("Fatal Python error")
    ]
    if not starts:
        return None
    dump = lines[starts[-1] :] if lines[starts[-1]].startswith("Current thread") else None
    if dump is None:  # the last "Fatal Python error": split its dump into threads
        sections: list[list[str]] = []
        for line in lines[starts[-1] :]:
            if line.startswith("Current thread") or line.startswith("Thread 0x"):
                sections.append([line])
            elif sections:
                sections[-1].append(line)
        current = [s for s in sections if s[0].startswith("Current thread")]
        if current:
            dump = current[0]
        elif sections:  # the main thread is the oldest, listed last
            main = _innermost_frame(sections[-1])
            return "a thread without Python frames" + (f" (main thread in {main})" if main else "")
        else:
            return None
    return _innermost_frame(dump)


def _innermost_frame(lines: list[str]) -> str | None:
    for line in lines:
        frame = line.strip()
        if frame.startswith('File "') and " in " in frame:
            path, _, rest = frame[6:].partition('", line ')
            number, _, function = rest.partition(" in ")
            return f"{function} ({Path(path).name}:{number})"
    return None


def _describe(rank: int, code: int, workdir: Path) -> str:
    beat = read_heartbeat(workdir, rank) or {}
    where = (
        f"during step {beat['step']}"
        if beat.get("step", -1) >= 0
        else f"during {beat.get('phase', 'startup')}"
    )
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        crash = native_crash_site(workdir / f"rank-{rank}.log") if -code in NATIVE_SIGNALS else None
        return f"rank {rank} was killed by {name} {where}" + (f" in {crash}" if crash else "")
    try:
        err = json.loads((workdir / f"error-{rank}.json").read_text())["message"]
    except (OSError, ValueError, KeyError):
        err = f"exit code {code}"
    return f"rank {rank} failed {where}: {err}"


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (Linux /proc: R running, S sleeping, T stopped, ...)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def _stalest_live_rank(procs: list, workdir: Path, *, exclude: int) -> str:
    """A note on the live rank most likely to blame: one the kernel reports stopped (SIGSTOP), else
    the one without progress longest when that is over 2 s; '' when none stands out."""
    now, candidates = time.time(), []
    for r, p in enumerate(procs):
        beat = read_heartbeat(workdir, r)
        if r == exclude or p.poll() is not None or beat is None:
            continue
        age = now - beat.get("since", beat["time"])
        stopped = process_state(p.pid) in ("T", "t")
        if stopped or age > 2.0:
            candidates.append((not stopped, -age, r, beat.get("step", -1), stopped))
    if not candidates:
        return ""
    _, minus_age, rank, step, stopped = min(candidates)
    if stopped:
        return f" (rank {rank} is stopped (SIGSTOP or a debugger) since step {step}, {-minus_age:.0f} s without progress)"
    return f" (rank {rank} is alive but silent for {-minus_age:.0f} s since step {step}: it looks hung)"


def stop_all(procs: list, grace_s: float = 3.0) -> None:
    """SIGTERM every live worker's process group, SIGKILL what is left after `grace_s` (a stopped
    process holds SIGTERM pending until it continues; SIGKILL ends it regardless)."""
    for p in procs:
        if p.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()


def watch(
    procs: list, workdir: Path, *, deadline_s: float, startup_s: float = 120.0, poll_s: float = 0.2
) -> None:
    """Return when every worker exited 0; otherwise stop them all and raise one clear ExecutorError.

    `deadline_s`: a rank whose heartbeat (written every second by a thread while the process runs)
    is older than this is frozen; `startup_s`: how long a rank may take to write its first one."""
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
            raise ExecutorError(
                f"{_describe(rank, code, workdir)}{suspect}; stopped all {world} ranks "
                f"({time.monotonic() - t_fail:.1f} s after the failure). Logs: {workdir}"
            )
        if all(c == 0 for c in codes):
            return
        now = time.time()
        for r, code in enumerate(codes):
            if code is not None:
                continue
            beat = read_heartbeat(workdir, r)
            if beat is not None and beat.get("pid") != procs[r].pid:
                beat = None  # not this launch's rank (yet)
            age = now - (beat["time"] if beat else started)
            if age > (deadline_s if beat else max(deadline_s, startup_s)):
                state = process_state(procs[r].pid)
                how = " (stopped: SIGSTOP or a debugger)" if state in ("T", "t") else ""
                where = (
                    f"step {beat['step']}"
                    if beat and beat.get("step", -1) >= 0
                    else (beat["phase"] if beat else "startup")
                )
                stop_all(procs)
                raise ExecutorError(
                    f"rank {r} stopped responding during {where}{how}: no heartbeat for "
                    f"{age:.0f} s (--timeout-s {deadline_s:g}); stopped all {world} ranks. "
                    f"Logs: {workdir}"
                )
        time.sleep(poll_s)
