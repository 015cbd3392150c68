"""Goodput: the time to train when failures happen and checkpoints are taken (numbers or numpy arrays).

A synchronous training job stops whenever any of its parts fails; it restarts from its last checkpoint,
losing the work done since and the restart itself. Checkpoints cost time too. With failures arriving
as a Poisson process of mean time between failures M (exponential inter-failure times, the assumption
of Young 1974 and Daly 2006), a checkpoint that stalls training for delta seconds every tau seconds
of computation, and a restart costing R seconds, Daly (2006) gives the expected wall time of a run of
W useful seconds in closed form; goodput = W / wall time. Symbols as in Daly 2006:

    M      job mean time between interruptions (s)
    delta  time training stalls for one checkpoint (s)
    R      restart time after an interruption (s): scheduler, process start, checkpoint read
    tau    computation between two checkpoints (s)
    W      useful computation of the run (Daly's T_s, "solve time"), s

Sources: J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
1974; J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22(3), 2006 (validation/reliability/reliability.json, 'formulas'). The failure rates, restart
overhead and storage bandwidths the planner feeds in are data (storage_profiles/); this module only
computes. docs/goodput.md explains the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SECONDS_PER_HOUR = 3600.0


# ------------------------------------------------------------------------------------------- failures


def job_failure_rate_per_hour(
    gpus, nodes, rate_per_gpu_hour, rate_per_node_hour, spot_rate_per_node_hour=0.0
):
    """Interruptions of the whole job per hour: independent Poisson processes add, so

        lambda_job = gpus x lambda_gpu + nodes x (lambda_node + lambda_spot)

    (a synchronous job stops when any GPU, any node, or any reclaimed spot node stops)."""
    return np.asarray(gpus, dtype=float) * rate_per_gpu_hour + np.asarray(nodes, dtype=float) * (
        rate_per_node_hour + spot_rate_per_node_hour
    )


def job_mtbf_s(rate_per_hour):
    """Mean time between interruptions of the job, s: M = 3600 / lambda_job (exponential
    inter-failure times)."""
    return SECONDS_PER_HOUR / np.asarray(rate_per_hour, dtype=float)


# ----------------------------------------------------------------------------------------- intervals


def young_interval_s(delta_s, mtbf_s):
    """Young (1974): the first-order optimum computation between checkpoints,

        tau_young = sqrt(2 delta M),

    from minimising the time lost per failure to first order; valid when delta << M."""
    return np.sqrt(2.0 * np.asarray(delta_s, dtype=float) * mtbf_s)


def daly_interval_s(delta_s, mtbf_s):
    """Daly (2006), the higher-order optimum of `expected_wall_s` (perturbation solution):

        tau_opt = sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta,  delta < 2M
        tau_opt = M,                                                                        delta >= 2M

    R scales the wall time by exp(R/M) and does not move the optimum. Daly's Fig. 3-5 (delta = 5 min,
    R = 10 min) give 117, 57 and 9.1 min for M = 24 h, 6 h and 15 min (tests/test_reliability.py)."""
    delta = np.asarray(delta_s, dtype=float)
    m = np.asarray(mtbf_s, dtype=float)
    xi = delta / (2.0 * m)
    tau = np.sqrt(2.0 * delta * m) * (1.0 + np.sqrt(xi) / 3.0 + xi / 9.0) - delta
    return np.where(delta < 2.0 * m, tau, m)


# --------------------------------------------------------------------------------------------- a run


def expected_wall_s(work_s, interval_s, delta_s, restart_s, mtbf_s):
    """Daly (2006), expected wall time of a run of W useful seconds checkpointed every tau seconds:

        T_w = M exp(R / M) (exp((tau + delta) / M) - 1) W / tau

    (each segment of tau + delta is retried until it survives; every failure costs the time spent in
    the failed attempt plus R). exp(x) - 1 is evaluated as expm1 for precision when M is large."""
    m = np.asarray(mtbf_s, dtype=float)
    return (
        m
        * np.exp(np.asarray(restart_s, dtype=float) / m)
        * np.expm1((np.asarray(interval_s, dtype=float) + delta_s) / m)
        * work_s
        / interval_s
    )


def goodput_fraction(interval_s, delta_s, restart_s, mtbf_s):
    """Useful time over wall time, W / T_w = tau / (M exp(R/M) (exp((tau + delta)/M) - 1)): independent
    of W in Daly's model. 1 - goodput -> delta/tau + (tau/2 + R)/M to first order."""
    return 1.0 / expected_wall_s(1.0, interval_s, delta_s, restart_s, mtbf_s)


def expected_interruptions(wall_s, mtbf_s):
    """Failures expected while the job runs: wall time / M (a Poisson process of rate 1/M over the
    whole wall time, restarts included, as in Daly's model)."""
    return np.asarray(wall_s, dtype=float) / mtbf_s


def checkpoint_stall_total_s(work_s, interval_s, delta_s):
    """Seconds spent in the checkpoints that complete: W / tau checkpoints of delta each."""
    return np.asarray(work_s, dtype=float) / interval_s * delta_s


def lost_s(wall_s, work_s, interval_s, delta_s):
    """Wall time neither computing nor in a completed checkpoint: work redone after failures,
    restarts, and checkpoints interrupted by a failure, T_w - W - (W / tau) delta."""
    return (
        np.asarray(wall_s, dtype=float)
        - work_s
        - checkpoint_stall_total_s(work_s, interval_s, delta_s)
    )


# ------------------------------------------------------------------------------------ checkpoint I/O


def transfer_s(bytes_per_node, bytes_total, per_node_Bps, aggregate_Bps):
    """Time to move a checkpoint between the nodes and storage: the slower of one node's share over
    its own link and the whole checkpoint over the storage service,

        t = max(bytes_per_node / B_node, bytes_total / B_aggregate)

    (a None bandwidth is not a limit). Nodes transfer in parallel, so the slowest link decides."""
    per_node = np.asarray(bytes_per_node, dtype=float) / per_node_Bps
    if aggregate_Bps is None:
        return per_node
    return np.maximum(per_node, np.asarray(bytes_total, dtype=float) / aggregate_Bps)


def checkpoint_write_s(unique_bytes, nodes, per_node_Bps, aggregate_Bps):
    """Write of one checkpoint: each byte of state written once, spread evenly over the nodes
    (replicated tensors are deduplicated and the writes balanced over the replicas, as
    torch.distributed.checkpoint's save planner and Megatron-Core's fully parallel save do):
    transfer_s(C / nodes, C, ...)."""
    nodes = np.asarray(nodes, dtype=float)
    return transfer_s(
        np.asarray(unique_bytes, dtype=float) / nodes, unique_bytes, per_node_Bps, aggregate_Bps
    )


def checkpoint_read_s(bytes_per_rank, ranks, ranks_per_node, per_node_Bps, aggregate_Bps):
    """Read of one checkpoint at restart: every rank loads the state it holds, replicas included
    (data-parallel replicas each read their copy): transfer_s(S_rank x ranks per node, S_rank x ranks)."""
    s = np.asarray(bytes_per_rank, dtype=float)
    return transfer_s(
        s * ranks_per_node, s * np.asarray(ranks, dtype=float), per_node_Bps, aggregate_Bps
    )


def staging_s(bytes_per_rank, device_to_host_Bps):
    """Stall of an asynchronous checkpoint: each rank copies its state to host memory (all ranks at
    once over their PCIe links) before training resumes and the write goes on in the background
    (torch.distributed.checkpoint.async_save; the PyTorch/IBM blog measured 6.3 s vs 148.8 s blocking
    for a 7B model)."""
    return np.asarray(bytes_per_rank, dtype=float) / device_to_host_Bps


# ------------------------------------------------------------------------------------------ together


@dataclass(frozen=True, kw_only=True, slots=True)
class RunReliability:
    """Expected figures of one training run under failures (all seconds unless named otherwise)."""

    work_s: float
    """Useful computation: steps x step time (the time to train if nothing ever failed)."""
    mtbf_s: float
    interval_s: float
    """Computation between checkpoints (Daly's optimum, at least the write latency)."""
    stall_s: float
    """Training stall per checkpoint (delta)."""
    restart_s: float
    """Cost of one interruption besides the lost work: restart overhead + checkpoint read + the write
    latency of an asynchronous checkpoint (R)."""
    wall_s: float
    """Expected wall time of the run (Daly 2006)."""
    goodput: float
    """work_s / wall_s."""
    interruptions: float
    """Expected interruptions over the run."""
    checkpoints: float
    """Checkpoints completed: work_s / interval_s."""
    checkpoint_stall_total_s: float
    lost_s: float
    """Redone work, restarts and interrupted checkpoints: wall - work - checkpoint stalls."""


def run_with_failures(
    work_s: float,
    *,
    stall_s: float,
    restart_s: float,
    mtbf_s: float,
    latency_s: float = 0.0,
    interval_s: float | None = None,
) -> RunReliability:
    """The run's expected wall time, goodput and losses at Daly's optimum interval (or `interval_s`).

    An asynchronous save stalls training for `stall_s` only; the checkpoint becomes durable
    `latency_s` later. A failure inside that window falls back to the previous checkpoint, which for
    a failure uniform over the interval costs (latency / tau) x tau = latency more work on average:
    latency adds to R. The next save cannot start before the last is durable, so tau >= latency.
    """
    tau = float(daly_interval_s(stall_s, mtbf_s)) if interval_s is None else float(interval_s)
    tau = max(tau, float(latency_s), 1e-9)
    r = float(restart_s) + float(latency_s)
    wall = float(expected_wall_s(work_s, tau, stall_s, r, mtbf_s))
    return RunReliability(
        work_s=float(work_s),
        mtbf_s=float(mtbf_s),
        interval_s=tau,
        stall_s=float(stall_s),
        restart_s=r,
        wall_s=wall,
        goodput=float(work_s) / wall if wall > 0 else 1.0,
        interruptions=float(expected_interruptions(wall, mtbf_s)),
        checkpoints=float(work_s) / tau,
        checkpoint_stall_total_s=float(checkpoint_stall_total_s(work_s, tau, stall_s)),
        lost_s=float(lost_s(wall, work_s, tau, stall_s)),
    )
