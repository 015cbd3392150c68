"""Spawn world-size local worker processes (gloo on CPU, or one GPU each with nccl) and watch them.

Each worker is `python -m planner.executor.worker RUNSPEC.json WORKDIR` with torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT). The parent watches exit codes and heartbeats
(faults.watch) and reads rank 0's gathered results from WORKDIR/result.pt. On a cluster, run
`planner run` itself under torchrun instead (docs/executor.md).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from planner.executor import ExecutorError
from planner.executor.faults import watch
from planner.executor.runspec import RunSpec


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
    workdir: str
    """Where the logs, heartbeats and result file are."""


def launch_local(spec: RunSpec, *, workdir: str | Path | None = None, stall_s: float | None = None) -> LaunchResult:
    """Run `spec` on world-size local processes; raise ExecutorError naming the failing rank."""
    world = spec.config.world_size
    work = Path(workdir or tempfile.mkdtemp(prefix="planner-run-"))
    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / "runspec.json"
    spec_path.write_text(spec.to_json())
    threads = max(1, (os.cpu_count() or 1) // world)
    base_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
                    LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    procs = []
    t0 = time.perf_counter()
    try:
        for rank in range(world):
            env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
            log = open(work / f"rank-{rank}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-m", "planner.executor.worker", str(spec_path), str(work)],
                                          env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
        watch(procs, work, stall_s=stall_s or max(120.0, 3 * spec.timeout_s))
    except KeyboardInterrupt:
        from planner.executor.faults import stop_all
        stop_all(procs)
        raise
    result_file = work / "result.pt"
    if not result_file.exists():
        raise ExecutorError(f"every rank exited 0 but rank 0 wrote no results. Logs: {work}")
    ranks = torch.load(result_file, weights_only=False)
    return LaunchResult(ranks=ranks, wall_s=time.perf_counter() - t0, workdir=str(work))
