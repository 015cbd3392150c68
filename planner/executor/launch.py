"""Spawn world-size local worker processes (gloo on CPU, or one GPU each with nccl) and watch them.

Each worker runs `planner.executor.worker.main(RUNSPEC.json, WORKDIR)` with torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): forked from this process for gloo (the imports of
torch and its distributed packages, ~5 s of CPU per process, and the model's initialization are paid
once), or as `python -m planner.executor.worker` in a fresh interpreter for nccl. The parent watches
exit codes and heartbeats (faults.watch) and reads rank 0's gathered results from WORKDIR/result.pt.
No rank outlives the launch: SIGTERM/SIGINT/SIGHUP to the launcher stop every rank before it exits
(lifecycle.stop_signals), and each rank dies with its launcher (lifecycle.die_with_parent). On a
cluster, run `planner run` itself under torchrun instead (docs/executor.md).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from planner.executor import ExecutorError
from planner.executor.faults import stop_all, watch
from planner.executor.lifecycle import Interrupted, stop_signals
from planner.executor.runspec import RunSpec, env_choice
from planner.io import fresh_subfolder
import planner.executor.worker as worker
from planner.models.transformer import build_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchResult:
    ranks: list
    """Per-rank results gathered on rank 0 (rank, coords, stages, step_times_s, losses, params)."""
    wall_s: float
    """Wall time of the whole launch (process start to exit)."""
    workdir: str | None
    """Where the logs, heartbeats and result file are; None once a temporary one was removed."""
    temporary: bool = False
    """The work directory is a temporary one the caller removes (`cleanup`) once done with it."""
    reference_model: object = None
    """The initialized full model the ranks started from (fork launches), for the reference."""

    def cleanup(self) -> None:
        if self.temporary and self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class _ForkedWorker:
    """A forked worker with the slice of subprocess.Popen's interface that faults.watch uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode


def _preload(spec: RunSpec):
    """Import what every worker needs once, in the parent, so forked workers skip ~5 s of imports
    each, and initialize the full model once (each forked rank takes it copy-on-write); returns it."""
    import torch.distributed.algorithms._checkpoint.checkpoint_wrapper  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    model = build_model(spec.model, device="cpu", seed=spec.seed)
    worker.PREBUILT.clear()
    worker.PREBUILT[(spec.model, spec.seed)] = model
    return model


def _fork_worker(args: list[str], env: dict, log_path: Path, threads: int) -> _ForkedWorker:
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return _ForkedWorker(pid)
    code = 1
    try:  # the child: own session (so the parent can stop its group), own log, torchrun's environment
        from planner.executor.lifecycle import default_signals, die_with_parent

        default_signals()
        die_with_parent(parent)
        os.setsid()
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        torch.set_num_threads(threads)
        from planner.executor.worker import main

        code = main(args, parent=parent)
    finally:
        os._exit(code)


def start_method(spec: RunSpec) -> str:
    """'fork' (gloo on Linux: workers inherit the parent's imports) or 'spawn' (fresh interpreters;
    nccl, or PLANNER_EXECUTOR_START=spawn)."""
    wanted = env_choice("PLANNER_EXECUTOR_START", ("fork", "spawn"))
    if wanted:
        return wanted
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return "spawn"  # a forked child would inherit this process's process group
    return (
        "fork"
        if spec.backend == "gloo" and hasattr(os, "fork") and sys.platform == "linux"
        else "spawn"
    )


def launch_local(
    spec: RunSpec, *, workdir: str | Path | None = None, keep_workdir: bool = False
) -> LaunchResult:
    """Run `spec` on world-size local processes; raise ExecutorError naming the failing rank, or
    `Interrupted` (after stopping every rank) when the launcher gets SIGTERM/SIGINT/SIGHUP.
    `workdir`: a folder in which the run makes its own fresh sub-folder (io.fresh_subfolder).
    `keep_workdir`: a temporary work directory outlives the launch (the caller verifies from its
    records, then calls `LaunchResult.cleanup`)."""
    world = spec.config.world_size
    # a --workdir gets a fresh sub-folder per run: nothing of the user's is replaced or removed
    if workdir:
        work = fresh_subfolder(workdir, "--workdir")
    else:
        work = Path(tempfile.mkdtemp(prefix="planner-run-"))
    spec_path = work / "runspec.json"
    spec_path.write_text(spec.to_json())
    threads = max(1, (os.cpu_count() or 1) // world)
    base_env = _launch_env(world, threads)
    procs = []
    method = start_method(spec)
    t0 = time.perf_counter()
    model = None
    with stop_signals():
        try:
            if method == "fork":
                model = _preload(spec)
            for rank in range(world):
                env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
                procs.append(_start_rank(method, spec_path, work, rank, env, threads))
            watch(procs, work, deadline_s=spec.timeout_s)
        except Interrupted as stop:
            stop_all(procs)
            raise Interrupted(
                stop.signum,
                f"stopped by {_signal_name(stop.signum)}: stopped all {world} ranks (logs: {work})",
            ) from None
        except BaseException:
            stop_all(procs)
            raise
        finally:
            import planner.executor.worker as worker

            worker.PREBUILT.clear()
    ranks = _rank_results(work)
    wall_s = time.perf_counter() - t0
    temporary = workdir is None
    if temporary and not keep_workdir:
        # a temporary directory of a run that succeeded: nothing in it is needed any more (result.pt
        # holds full parameters, hundreds of MB for a large proxy); a failed run keeps its logs
        shutil.rmtree(work, ignore_errors=True)
        return LaunchResult(ranks=ranks, wall_s=wall_s, workdir=None, reference_model=model)
    return LaunchResult(
        ranks=ranks, wall_s=wall_s, workdir=str(work), temporary=temporary, reference_model=model
    )


def _launch_env(world: int, threads: int) -> dict[str, str]:
    """The environment every local rank shares (torch.distributed's env:// rendezvous on this
    host, threads per rank, the launcher's pid)."""
    return dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        OMP_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
        PLANNER_LAUNCHER_PID=str(os.getpid()),
    )


def _start_rank(method: str, spec_path: Path, work: Path, rank: int, env: dict, threads: int):
    """One rank: a forked worker, or `python -m planner.executor.worker` in its own session, its
    output in rank-N.log."""
    if method == "fork":
        return _fork_worker([str(spec_path), str(work)], env, work / f"rank-{rank}.log", threads)
    log = open(work / f"rank-{rank}.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner.executor.worker",
            str(spec_path),
            str(work),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return proc


def _rank_results(work: Path) -> list[dict]:
    """Rank 0's result.pt, each rank's parameters loaded from their file where saved apart."""
    result_file = work / "result.pt"
    if not result_file.exists():
        raise ExecutorError(f"every rank exited 0 but rank 0 wrote no results. Logs: {work}")
    ranks = torch.load(result_file, weights_only=False)
    for r in ranks:
        if isinstance(r.get("params"), dict) and set(r["params"]) == {"file"}:
            r["params"] = torch.load(r["params"]["file"], weights_only=True, mmap=True)
    return ranks


def _signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name
