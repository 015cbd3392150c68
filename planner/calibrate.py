"""Measure this machine and fit the physical models the cost models use (`planner hardware calibrate`).

What is measured, by `world_size` local processes running at the same time (so each number is what
one rank gets while the others work, as in a training step):
- GEMM rate: `torch.mm` on square matrices of several sizes, per dtype (fp32 and bf16 on CPU;
  fp32 without TF32, tf32, fp16 and bf16 on CUDA).
- Memory bandwidth: a large tensor copy, counted as read + write bytes per second.
- Collectives over torch.distributed (gloo on CPU, NCCL when CUDA is present): all-reduce,
  all-gather, reduce-scatter over a range of message sizes, and point-to-point ping-pong.

What is fitted (scipy.optimize.least_squares on relative residuals, so that small and large
messages weigh alike):
- Collectives, the alpha-beta model (Hockney; Thakur, Rabenseifner & Gropp, "Optimization of
  collective communication operations in MPICH", IJHPCA 2005), written with the nccl-tests
  bus-bandwidth definitions (nccl-tests doc/PERFORMANCE.md):
      t(S) = steps(n) * alpha + busfactor(n) * S / B_bus
  with the latency steps the cost model charges (latency_steps): allreduce min(2(n-1), 2 log2 n)
  (ring or tree), busfactor 2(n-1)/n; allgather and reduce-scatter: steps n-1,
  busfactor (n-1)/n; point-to-point: steps 1, busfactor 1. S is the nccl-tests "size": the
  all-reduce buffer, the all-gather output, the reduce-scatter input, the p2p message.
- GEMM, a fixed per-call overhead plus a constant rate (the roofline's compute roof plus launch cost):
      t(F) = t0 + F / R,   efficiency(F) = (F / t) / R = 1 / (1 + F_half / F),  F_half = t0 * R
  where F = 2 m n k FLOPs.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from multiprocessing import resource_tracker
from pathlib import Path

import numpy as np

from cost_models.comm import allreduce_latency_steps
from hardware_profiles.loader import previous_profile, profile_from_dict
from planner.errors import ConfigError
from planner.io import write_json
from planner.executor import ExecutorError
from planner.executor.lifecycle import (
    Interrupted,
    die_with_parent,
    parent_alive,
    run_as_rank,
    starting_ranks,
    stop_signals,
)

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "p2p")
MAX_BUSBW_GBPS = 1e4
"""Upper bound of a fitted bandwidth (no link moves 10 TB/s per device); also the profile files' bound."""


# ----------------------------------------------------------------------------------------- models


def latency_steps(collective: str, world_size: int) -> float:
    """Latency terms the cost model charges each collective (cost_models.comm): all-reduce, the
    fewer of the ring's 2(n-1) and the tree's 2 log2 n (cost_models.comm.allreduce_latency_steps);
    all-gather and reduce-scatter, the ring's n-1 (Thakur et al. 2005); 1 for p2p. Each fit's
    alpha gives back that collective's measured times through the cost model; the profile keeps
    one latency per step, the all-reduce's, which every collective and pipeline hop then uses
    (so where the backend's all-gather, reduce-scatter or p2p latency differs, as gloo's p2p at
    a tenth of a collective step does, those are costed at the all-reduce's step)."""
    n = world_size
    if collective == "allreduce":
        return float(allreduce_latency_steps(n))
    return float({"allgather": n - 1, "reducescatter": n - 1, "p2p": 1}[collective])


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests bus-bandwidth factor (doc/PERFORMANCE.md): busbw = algbw * factor.

    allreduce 2(n-1)/n; allgather and reducescatter (n-1)/n; p2p (sendrecv) 1.
    """
    n = world_size
    return {
        "allreduce": 2 * (n - 1) / n,
        "allgather": (n - 1) / n,
        "reducescatter": (n - 1) / n,
        "p2p": 1.0,
    }[collective]


def collective_seconds(
    collective: str, world_size: int, size_bytes, alpha_s: float, busbw_Bps: float
):
    """Alpha-beta time of one collective on `size_bytes` (scalar or array), seconds."""
    size = np.asarray(size_bytes, dtype=float)
    return (
        latency_steps(collective, world_size) * alpha_s
        + bus_factor(collective, world_size) * size / busbw_Bps
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveFit:
    """Fitted alpha-beta parameters of one collective."""

    collective: str
    world_size: int
    alpha_us: float
    """Latency per step (latency_steps), microseconds."""
    busbw_GBps: float
    """Asymptotic bus bandwidth (nccl-tests definition), GB/s."""
    rms_rel_error: float
    """Root-mean-square relative error of the fit over the measured points."""
    points: int
    bandwidth_share_at_max: float
    """Share of the bandwidth term in the fitted time of the largest message; near 0 means the sizes
    were too small to identify the bandwidth (it then sits at its bound, MAX_BUSBW_GBPS)."""


def fit_alpha_beta(collective: str, world_size: int, sizes_bytes, times_s) -> CollectiveFit:
    """Least-squares fit of `collective_seconds` to measured (size, time) pairs.

    Residuals are relative, (model - t) / t, so that microsecond and second timings count alike;
    a soft-L1 loss keeps one descheduled sample on a shared machine from dragging the fit.
    Parameters are scaled to microseconds and seconds-per-GB so that both are of order one.
    """
    if collective == "p2p" or world_size < 2:
        world_size = max(world_size, 2)
    sizes = np.asarray(sizes_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if sizes.size < 2 or np.any(times <= 0):
        raise ValueError("need at least two positive timings to fit alpha and beta")
    steps, factor = latency_steps(collective, world_size), bus_factor(collective, world_size)

    def residual(x):
        alpha_us, s_per_GB = x
        model = steps * alpha_us * 1e-6 + factor * sizes / 1e9 * s_per_GB
        return (model - times) / times

    # Linear start: ordinary least squares on the same relative residuals.
    design = np.stack([steps * 1e-6 / times, factor * sizes / 1e9 / times], axis=1)
    start, *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    lowest = 1.0 / MAX_BUSBW_GBPS
    start = np.maximum(start, [1e-3, 2 * lowest])
    from scipy.optimize import least_squares  # 1.5 s to import: only when fitting

    result = least_squares(
        residual,
        start,
        bounds=([0.0, lowest], [np.inf, np.inf]),
        loss="soft_l1",
        f_scale=0.05,
        x_scale="jac",
    )
    alpha_us, s_per_GB = result.x
    rms = float(np.sqrt(np.mean(residual(result.x) ** 2)))
    beta_term = factor * sizes.max() / 1e9 * s_per_GB
    return CollectiveFit(
        collective=collective,
        world_size=world_size,
        alpha_us=float(alpha_us),
        busbw_GBps=float(1.0 / s_per_GB),
        rms_rel_error=rms,
        points=int(sizes.size),
        bandwidth_share_at_max=float(beta_term / (beta_term + steps * alpha_us * 1e-6)),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmFit:
    """Fitted GEMM time model t = t0 + F / R for one dtype."""

    dtype: str
    rate_tflops: float
    """Asymptotic rate R, TFLOP/s."""
    overhead_us: float
    """Fixed per-call cost t0, microseconds."""
    best_measured_tflops: float
    """Highest rate seen over the measured shapes, TFLOP/s."""
    rms_rel_error: float
    points: int

    @property
    def half_efficiency_flops(self) -> float:
        """F_half = t0 * R: the GEMM size (FLOPs) that reaches half the asymptotic rate."""
        return self.overhead_us * 1e-6 * self.rate_tflops * 1e12

    def efficiency(self, flops):
        """Fraction of R reached by a GEMM of `flops`: 1 / (1 + F_half / F)."""
        return 1.0 / (1.0 + self.half_efficiency_flops / np.asarray(flops, dtype=float))


def fit_gemm(dtype: str, flops, times_s) -> GemmFit:
    """Least-squares fit of t = t0 + F/R (relative residuals, t0 >= 0) to measured GEMM times."""
    flops_arr = np.asarray(flops, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if flops_arr.size < 2 or np.any(times <= 0):
        raise ValueError("need at least two positive timings to fit the GEMM curve")

    def residual(x):
        overhead_us, s_per_Tflop = x
        return (overhead_us * 1e-6 + flops_arr / 1e12 * s_per_Tflop - times) / times

    design = np.stack([1e-6 / times, flops_arr / 1e12 / times], axis=1)
    start, *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    start = np.maximum(start, [1e-3, 1e-9])
    from scipy.optimize import least_squares

    result = least_squares(
        residual,
        start,
        bounds=([0.0, 1e-12], [np.inf, np.inf]),
        loss="soft_l1",
        f_scale=0.05,
        x_scale="jac",
    )
    overhead_us, s_per_Tflop = result.x
    return GemmFit(
        dtype=dtype,
        rate_tflops=float(1.0 / s_per_Tflop),
        overhead_us=float(overhead_us),
        best_measured_tflops=float(np.max(flops_arr / times) / 1e12),
        rms_rel_error=float(np.sqrt(np.mean(residual(result.x) ** 2))),
        points=int(flops_arr.size),
    )


# ------------------------------------------------------------------------------------ measuring


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What one calibration run measures."""

    world_size: int
    gemm_sizes: tuple[int, ...]
    """Square GEMM edge lengths (m = n = k)."""
    copy_bytes: int
    """Bytes of the tensor copied for the memory-bandwidth measurement (moved: twice that)."""
    message_bytes: tuple[int, ...]
    """Collective message sizes (nccl-tests 'size')."""
    repeats: int
    """Timed repetitions per point; the median is kept."""
    target_s: float
    """Wall time each timed repetition aims at (iterations chosen to reach it)."""
    max_gemm_s: float
    """Larger GEMMs of a dtype are skipped once one call takes longer than this (slow dtypes on CPU)."""


def make_plan(world_size: int, quick: bool) -> Plan:
    if quick:
        return Plan(
            world_size=world_size,
            gemm_sizes=(32, 64, 128),
            copy_bytes=16 << 20,
            message_bytes=(1 << 10, 1 << 15, 1 << 20),
            repeats=2,
            target_s=0.005,
            max_gemm_s=0.05,
        )
    return Plan(
        world_size=world_size,
        gemm_sizes=(64, 128, 256, 512, 1024, 2048),
        copy_bytes=256 << 20,
        message_bytes=tuple(1 << p for p in range(10, 27, 2)),
        repeats=5,
        target_s=0.1,
        max_gemm_s=0.5,
    )


def _timed(fn, sync, iters: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    plan: Plan | dict,
    out_dir: str,
    launcher: int | None = None,
) -> None:
    """One rank: GEMMs, copy, then collectives; writes out_dir/rank<r>.json before teardown. It dies
    with `launcher` (the calibrating process): no rank outlives an interrupted calibration."""
    _watch_launcher(die_with_parent(launcher))
    plan = Plan(**plan) if isinstance(plan, dict) else plan
    import torch.distributed as dist

    meter = _Meter(rank, world_size, backend, plan)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    t_start = time.perf_counter()
    result: dict = {"rank": rank, "gemm": _measure_gemms(meter)}
    result.update(_measure_copies(meter))
    result["collectives"] = _measure_collectives(meter)
    result["measure_s"] = time.perf_counter() - t_start
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _watch_launcher(parent) -> None:
    """A daemon thread that ends this rank when the calibrating process is gone."""
    import threading

    def watch_parent():
        while parent_alive(parent):
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True).start()


class _Meter:
    """One rank's device, clock and agreed timing: every rank runs the same number of iterations of
    each measurement, and a measurement's time is its slowest rank's (MAX-reduced median)."""

    def __init__(self, rank: int, world_size: int, backend: str, plan: Plan):
        import torch

        self.rank, self.world_size, self.plan = rank, world_size, plan
        self.use_cuda = backend == "nccl"
        if self.use_cuda:
            torch.cuda.set_device(rank)
            self.device = torch.device("cuda", rank)
            self.sync = torch.cuda.synchronize
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
            self.device = torch.device("cpu")
            self.sync = lambda: None  # CPU ops are synchronous

    def agreed_iters(self, seconds_one: float) -> int:
        """Iterations to fill target_s, agreed by all ranks (they must run the same collectives): the
        busiest rank's estimate, the smallest."""
        import torch
        import torch.distributed as dist

        want = torch.tensor(
            [max(1, min(10_000, math.ceil(self.plan.target_s / max(seconds_one, 1e-7))))],
            dtype=torch.int64,
            device=self.device,
        )
        dist.all_reduce(want, op=dist.ReduceOp.MIN)  # idle p2p ranks ask for many
        return int(want.item())

    def measure(self, fn) -> float:
        import torch
        import torch.distributed as dist

        fn()  # warm-up (allocations, algorithm choice, connection setup)
        iters = self.agreed_iters(_timed(fn, self.sync, 1))
        samples = []
        for _ in range(self.plan.repeats):
            dist.barrier()
            local = torch.tensor(
                [_timed(fn, self.sync, iters)], dtype=torch.float64, device=self.device
            )
            dist.all_reduce(local, op=dist.ReduceOp.MAX)  # an op ends when its slowest rank ends
            samples.append(float(local.item()))
        return statistics.median(samples)


def _measure_gemms(meter: _Meter) -> dict:
    """Square GEMMs per dtype (tf32 and fp16 on CUDA only), growing until one takes max_gemm_s."""
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if meter.use_cuda:
        dtypes = {
            "fp32": torch.float32,
            "tf32": torch.float32,
            "fp16": torch.float16,
            "bf16": torch.bfloat16,
        }
    out = {}
    for name, dtype in dtypes.items():
        if meter.use_cuda:
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        rows = []
        for n in meter.plan.gemm_sizes:
            a = torch.randn(n, n, device=meter.device, dtype=dtype)
            b = torch.randn(n, n, device=meter.device, dtype=dtype)
            rows.append([n, n, n, meter.measure(lambda: torch.mm(a, b))])
            _progress(
                meter.rank,
                f"gemm {name} {n}^3: {2 * n**3 / rows[-1][3] / 1e9:.2f} GFLOP/s per rank",
            )
            if rows[-1][3] > meter.plan.max_gemm_s:  # MAX-reduced: every rank stops together
                break
        out[name] = rows
    return out


def _measure_copies(meter: _Meter) -> dict:
    """A device-to-device copy (read + write bytes) and, on CUDA, a pinned host-to-device copy
    (PCIe, one direction, bytes counted once)."""
    import torch

    size = meter.plan.copy_bytes
    src = torch.empty(size, dtype=torch.uint8, device=meter.device).fill_(1)
    dst = torch.empty_like(src)
    copy = {"bytes_moved": 2 * size, "seconds": meter.measure(lambda: dst.copy_(src))}
    out = {"copy": copy}
    _progress(meter.rank, f"copy: {copy['bytes_moved'] / copy['seconds'] / 1e9:.2f} GB/s per rank")
    if meter.use_cuda:
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        out["host_to_device"] = {
            "bytes_moved": size,
            "seconds": meter.measure(lambda: dst.copy_(host, non_blocking=True)),
        }
    return out


def _measure_collectives(meter: _Meter) -> dict:
    """Each of COLLECTIVES over the message sizes: seconds per call (p2p: one way)."""
    out = {}
    for coll in COLLECTIVES:
        rows = []
        for size in meter.plan.message_bytes:
            elems = max(meter.world_size, size // 4 // meter.world_size * meter.world_size)
            seconds = meter.measure(_collective_call(meter, coll, elems))
            if coll == "p2p":
                seconds /= 2.0  # a ping-pong is two one-way messages
            rows.append([elems * 4, seconds])
            _progress(meter.rank, f"{coll} {elems * 4} B: {seconds * 1e6:.1f} us")
        out[coll] = rows
    return out


def _collective_call(meter: _Meter, coll: str, elems: int):
    """A call of `coll` on `elems` fp32 elements (divisible by the world size) of fresh buffers."""
    import torch
    import torch.distributed as dist

    n, device = meter.world_size, meter.device
    if coll == "allreduce":
        buf = torch.ones(elems, device=device)
        return lambda: dist.all_reduce(buf)
    if coll == "allgather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        shard, full = torch.ones(elems // n, device=device), torch.empty(elems, device=device)
        return lambda: gather(full, shard)
    if coll == "reducescatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        full, shard = torch.ones(elems, device=device), torch.empty(elems // n, device=device)
        return lambda: scatter(shard, full)
    return _pingpong(dist, meter.rank, torch.ones(elems, device=device))


def _progress(rank: int, line: str) -> None:
    """One line per measured point on stderr (rank 0 only), so a long calibration shows where it is."""
    if rank == 0:
        print(line, file=sys.stderr, flush=True)


def _pingpong(dist, rank: int, buf):
    """Rank 0 sends to 1 and receives back; the other ranks wait (their time is not the p2p time)."""

    def fn():
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    return fn


def _wait_all(procs, out_dir: str, *, deadline_s: float) -> None:
    """Join the ranks; if one dies without its results (the others would wait forever in a
    collective) or the deadline passes, stop the rest and raise."""
    start = time.monotonic()
    while any(p.is_alive() for p in procs):
        for r, p in enumerate(procs):
            if p.exitcode not in (None, 0) and not Path(out_dir, f"rank{r}.json").exists():
                _stop(procs)
                raise ExecutorError(
                    f"calibration rank {r} failed (exit code {p.exitcode}) before writing results"
                )
        if time.monotonic() - start > deadline_s:
            _stop(procs)
            raise ExecutorError(
                f"calibration did not finish within {deadline_s:.0f} s; stopped all {len(procs)} ranks"
            )
        time.sleep(0.1)


def _stop(procs, grace_s: float = 5.0) -> None:
    """SIGTERM every live rank, SIGKILL what is left after `grace_s`."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


TEMP_PREFIX = "planner-calibrate-"
"""Prefix of a calibration's temporary folder, followed by the calibrating process's pid."""


def sweep_temporary_dirs(root: str | None = None) -> list[Path]:
    """Remove the temporary folders of calibrations whose process is gone (a SIGKILL runs no
    clean-up code); returns them. A folder is removed only when its name carries a pid that no
    longer runs."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*"):
        pid = folder.name[len(TEMP_PREFIX) :].split("-")[0]
        if folder.is_dir() and pid.isdigit() and not _pid_running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def run_measurements(world_size: int, *, quick: bool = False, backend: str | None = None) -> dict:
    """Launch `world_size` local ranks, measure, and return the results (each timing: median over
    repeats of the slowest rank's time per call)."""
    import torch
    import torch.multiprocessing as mp

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if world_size < 2:
        raise ConfigError("world-size", world_size, "at least 2 (collectives need two ranks)")
    if backend == "nccl" and world_size > torch.cuda.device_count():
        raise ConfigError(
            "world-size",
            world_size,
            f"at most {torch.cuda.device_count()} with NCCL (one GPU per rank on this machine)",
        )
    # optional heavy dependency: planner.executor.launch imports torch at its top
    from planner.executor.launch import free_port

    plan = make_plan(world_size, quick)
    ctx = mp.get_context("spawn")
    started = time.perf_counter()
    sweep_temporary_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as out_dir:
        port = free_port()
        args = (world_size, port, backend, asdict(plan), out_dir, os.getpid())
        target = f"{__name__}:_worker"
        procs = [
            ctx.Process(target=run_as_rank, args=(os.getpid(), target, r, *args), daemon=False)
            for r in range(world_size)
        ]
        # spawn starts multiprocessing's resource tracker at the first start, and its start
        # unblocks SIGINT in this process: started first, it leaves starting_ranks' block whole
        resource_tracker.ensure_running()
        with stop_signals():
            try:
                with starting_ranks():
                    for p in procs:
                        p.start()
                _wait_all(procs, out_dir, deadline_s=120.0 if quick else 900.0)
            except Interrupted as stop:
                _stop(procs)
                raise Interrupted(
                    stop.signum,
                    f"calibration stopped by {signal.Signals(stop.signum).name}: "
                    f"stopped all {world_size} ranks",
                ) from None
            except BaseException:
                _stop(procs)
                raise
        results = []
        for r, p in enumerate(procs):
            path = Path(out_dir, f"rank{r}.json")
            if not path.exists():  # judged by the results written, not teardown (executor-notes)
                raise ExecutorError(
                    f"calibration rank {r} exited with code {p.exitcode} before writing results"
                )
            results.append(json.loads(path.read_text()))
    merged = results[
        0
    ]  # every timing is already the slowest rank's (MAX-reduced), the same on all ranks
    merged.update(
        wall_s=time.perf_counter() - started,
        backend=backend,
        world_size=world_size,
        quick=quick,
        plan=asdict(plan),
    )
    return merged


# ------------------------------------------------------------------------------------ profile


def fit_measurements(measured: dict) -> dict:
    """Fits of every GEMM dtype and collective in `measured` (output of run_measurements)."""
    n = measured["world_size"]
    gemm = {}
    for name, rows in measured["gemm"].items():
        flops = [2.0 * m * k * nn for m, nn, k, _ in rows]
        gemm[name] = fit_gemm(name, flops, [row[3] for row in rows])
    coll = {
        name: fit_alpha_beta(name, n, [r[0] for r in rows], [r[1] for r in rows])
        for name, rows in measured["collectives"].items()
    }
    return {"gemm": gemm, "collectives": coll}


def build_profile(measured: dict, *, name: str, command: str, previous: dict | None = None) -> dict:
    """The profile document (hardware_profiles file format) for a calibrated local machine.

    `previous`: an existing file at the output path; its `efficiency` keys are kept (the cost
    models own them), with the keys measured here updated.
    """
    fits = fit_measurements(measured)
    n, backend = measured["world_size"], measured["backend"]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cores = os.cpu_count() or 1
    run = dict(n=n, backend=backend, date=date, cores=cores, threads=max(1, cores // n))
    run["where"] = (
        f"measured by `{command}` on {date} ({n} ranks, {backend}; {platform.node() or 'this host'})"
    )
    copy_GBps = measured["copy"]["bytes_moved"] / measured["copy"]["seconds"] / 1e9
    h2d = measured.get("host_to_device")
    h2d_GBps = h2d["bytes_moved"] / h2d["seconds"] / 1e9 if h2d else copy_GBps
    ar = fits["collectives"]["allreduce"]
    link = link_GBps(fits)
    device, memory_bytes, mem_src = _device_memory(run)
    gemm_peaks = {k: round(f.best_measured_tflops, 6) for k, f in fits["gemm"].items()}
    efficiency = dict((previous or {}).get("efficiency", {}))
    efficiency.update(efficiency_from_fits(fits, gemm_peaks))
    if backend == "gloo":
        # n ranks x threads on `cores` cores: a rank alone runs up to this much faster than with all busy
        efficiency["shared_cores_speedup"] = max(1.0, n * run["threads"] / cores)
    return {
        "schema_version": "1",
        "name": name,
        "description": f"This machine as {n} local {backend} ranks, calibrated {date}",
        "device": device,
        "devices_per_node": n,
        "memory_bytes": memory_bytes,
        "memory_bandwidth_GBps": round(copy_GBps, 3),
        "peak_tflops": gemm_peaks,
        "intra_node_interconnect": "loopback TCP (gloo)"
        if backend == "gloo"
        else "NCCL intra-node",
        "intra_node_GBps_per_device": round(link, 4),
        "intra_node_latency_us": round(max(ar.alpha_us, 0.01), 3),
        "inter_node_interconnect": "none (single machine; loopback figures)",
        "nics_per_node": 1,
        "Gbps_per_nic": round(link * 8, 4),
        "inter_node_Gbps_per_node": round(link * 8, 4),
        "inter_node_latency_us": round(max(ar.alpha_us, 0.01), 3),
        "host_device_GBps": round(h2d_GBps, 3),
        "price_usd_per_hour": None,
        "efficiency": efficiency,
        "sources": _profile_sources(measured, run, mem_src),
        "calibration": _calibration_record(measured, fits, run, command, copy_GBps, h2d_GBps),
    }


def _device_memory(run: dict) -> tuple[str, int, str]:
    """(device name, memory bytes per rank, where the memory figure comes from): the GPU's, or the
    host's shared by the ranks."""
    import torch

    if run["backend"] == "nccl":
        return (
            torch.cuda.get_device_name(0),
            int(torch.cuda.get_device_properties(0).total_memory),
            "torch.cuda.get_device_properties(0).total_memory",
        )
    n, cores, threads = run["n"], run["cores"], run["threads"]
    return (
        f"{_cpu_model()} ({cores} cores, {threads} thread(s) per rank), torch {torch.__version__} CPU",
        _host_memory_bytes() // n,
        f"host MemTotal / {n} ranks (ranks share the host memory)",
    )


def _profile_sources(measured: dict, run: dict, mem_src: str) -> dict[str, str]:
    """The profile's `sources`: how each value was measured."""
    n, cores, threads, where = run["n"], run["cores"], run["threads"], run["where"]
    single_node_note = (
        "single machine: no network was measured; the inter-node keys repeat the local fits "
        "(bandwidth: the point-to-point fit; latency: the all-reduce's alpha) so that plans "
        "spanning 'nodes' of this profile stay computable"
    )
    return {
        "device": where,
        "devices_per_node": f"the number of local ranks calibrated ({n} processes on "
        f"{cores} cores)",
        "memory_bytes": f"{mem_src}; {where}",
        "memory_bandwidth_GBps": f"copy of {measured['copy']['bytes_moved'] // 2} B per rank, all ranks at "
        f"once, read + write bytes per second; {where}",
        "peak_tflops": "best measured torch.mm rate per rank over the GEMM sizes with all ranks busy "
        f"(no datasheet for this device); {where}",
        "intra_node_GBps_per_device": f"1/beta of the alpha-beta fit of p2p ping-pong; {where}",
        "intra_node_latency_us": f"alpha (latency per step) of the all-reduce fit; {where}",
        "nics_per_node": single_node_note,
        "Gbps_per_nic": single_node_note,
        "inter_node_Gbps_per_node": single_node_note,
        "inter_node_latency_us": single_node_note,
        "host_device_GBps": "host and device are the same memory on a CPU: the copy bandwidth"
        if run["backend"] == "gloo"
        else f"pinned host to device copy, all ranks at once; {where}",
        "price_usd_per_hour": "a local machine: no hourly price",
        "efficiency": "*_bus_efficiency = fitted bus bandwidth of that collective / p2p link bandwidth; "
        "gemm_efficiency_max[_fp32] = fitted GEMM rate R / peak_tflops of bf16 [fp32]; "
        f"gemm_fixed_us = fitted fp32 GEMM overhead t0; shared_cores_speedup = ranks x "
        f"threads per rank / cores ({n} x {threads} / {cores}); {where}; other keys kept from the "
        "previous file (docs/calibration.md)",
    }


def _calibration_record(
    measured: dict, fits: dict, run: dict, command: str, copy_GBps: float, h2d_GBps: float
) -> dict:
    """The profile's `calibration` block: the run, every fit and the points it was fitted to."""
    import torch

    h2d = measured.get("host_to_device")
    return {
        "command": command,
        "date": run["date"],
        "torch": torch.__version__,
        "backend": run["backend"],
        "world_size": run["n"],
        "threads_per_rank": run["threads"] if run["backend"] == "gloo" else None,
        "cpu_count": run["cores"],
        "quick": measured["quick"],
        "wall_s": measured.get("wall_s"),
        "measure_s": measured.get("measure_s"),
        "load_average_1min": measured.get("load_average_1min"),
        "gemm": {
            k: {
                **_fit_dict(f),
                "half_efficiency_flops": f.half_efficiency_flops,
                "points_m_n_k_s": measured["gemm"][k],
            }
            for k, f in fits["gemm"].items()
        },
        "copy": {**measured["copy"], "GBps": copy_GBps},
        "host_to_device": {**h2d, "GBps": h2d_GBps} if h2d else None,
        "collectives": {
            k: {**_fit_dict(f), "points_bytes_s": measured["collectives"][k]}
            for k, f in fits["collectives"].items()
        },
        "model": "collective t(S) = steps(n)*alpha + busfactor(n)*S/busbw (nccl-tests bus bandwidth); "
        "gemm t(F) = t0 + F/R, F = 2mnk",
    }


def link_GBps(fits: dict) -> float:
    """The link rate a calibrated profile records: the point-to-point ping-pong's bus bandwidth."""
    return fits["collectives"]["p2p"].busbw_GBps


MIN_BANDWIDTH_SHARE = 0.05  # below this the beta term is <5% of the largest message's time
MAX_BUS_RATIO = 16.0  # the efficiency table's ceiling for *_bus_efficiency


def efficiency_from_fits(fits: dict, gemm_peaks: dict[str, float]) -> dict[str, float]:
    """The cost models' `efficiency` keys (docs/cost-model.md) that a calibration measures.

    - `<coll>_bus_efficiency` = B_bus(coll) / B_p2p: with intra_node_GBps_per_device = B_p2p, the
      cost model's link x efficiency reproduces each fitted bus bandwidth (on loopback gloo a ring
      collective can beat one ping-pong, so these may exceed 1; the table allows up to 16).
    - `gemm_efficiency_max_fp32` / `gemm_efficiency_max` = R / peak of fp32 / bf16 and
      `gemm_fixed_us` = t0 (fp32, the CPU training dtype): the cost model's
      t = F / (peak e_max) + t0 is then exactly the fitted t = t0 + F / R.
    """
    link = link_GBps(fits)
    out = {}
    for c in ("allreduce", "allgather", "reducescatter"):
        fit = fits["collectives"].get(c)
        # A fit whose largest message is still latency-bound (loaded host, tiny --quick sizes) has
        # not seen the bandwidth: its ratio would be noise, so the profile keeps its previous value.
        if fit is None or fit.bandwidth_share_at_max < MIN_BANDWIDTH_SHARE:
            continue
        ratio = fit.busbw_GBps / link
        if 0 < ratio <= MAX_BUS_RATIO:
            out[f"{c}_bus_efficiency"] = float(f"{ratio:.4g}")
    gemm = fits["gemm"]
    if "fp32" in gemm:
        out["gemm_efficiency_max_fp32"] = round(
            min(1.0, gemm["fp32"].rate_tflops / gemm_peaks["fp32"]), 4
        )
        out["gemm_fixed_us"] = round(gemm["fp32"].overhead_us, 3)
    low = "bf16" if "bf16" in gemm else "fp16" if "fp16" in gemm else None
    if low:
        out["gemm_efficiency_max"] = round(min(1.0, gemm[low].rate_tflops / gemm_peaks[low]), 4)
    return out


def _fit_dict(fit) -> dict:
    return {k: v for k, v in asdict(fit).items() if k not in ("dtype", "collective")}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def _host_memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def calibrate(*, out: Path, world_size: int, quick: bool, name: str, command: str) -> dict:
    """Measure, fit, write the profile to `out` atomically (keeping its efficiency keys if it
    exists), return it. `out` is checked before anything is measured (`previous_profile`)."""
    previous = previous_profile(out)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    measured = run_measurements(world_size, quick=quick)
    measured["load_average_1min"] = {
        "before": load_before,
        "after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    doc = build_profile(measured, name=name, command=command, previous=previous)
    profile_from_dict(doc, origin=str(out))  # what we write must load
    write_json(out, doc, "--out")
    return doc
