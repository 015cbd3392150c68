"""A plan document's reliability figures: what its checkpoint holds, how long the chosen storage takes
to write and read it, how often the job fails, and so the checkpoint interval, the goodput and the
time and cost to train with failures (cost_models.reliability; docs/goodput.md).

The one owner of "plan document -> prediction.reliability": recommend (planner.search) and the report
call `reliability_figures`; nothing else computes these numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from cost_models import reliability as R
from planner.errors import ConfigError
from storage_profiles import (
    CHECKPOINT_MODES,
    StorageProfile,
    load_reliability_defaults,
    load_storage,
)
from frameworks import load_framework
from cost_models.memory import state_bytes_per_param, zero_sharded
from cost_models.offload import pcie_Bps

MAX_MTBF_HOURS = 1e9
"""Largest --mtbf-gpu-hours / --mtbf-node-hours: about 100,000 years per part."""
MAX_RESTART_S = 7 * 86400.0
"""Longest --restart-s: a week."""
MAX_SPOT_RATE = 100.0
"""Largest --spot-interruptions-per-node-hour: one reclaim every 36 s per node."""
MIN_GOODPUT = 1e-3
"""Below this the run never finishes in any useful sense (the job fails faster than it restarts):
refused with the numbers that cause it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReliabilityInputs:
    """The user's own reliability numbers; None takes storage_profiles/reliability_defaults.json."""

    mtbf_gpu_hours: float | None = None
    """Mean GPU-hours between job interruptions caused by one GPU (1 / failures per GPU-hour). Given
    alone or with mtbf_node_hours, it replaces both default rates (a term not given is zero)."""
    mtbf_node_hours: float | None = None
    """Mean node-hours between job interruptions caused by one node's other parts."""
    restart_s: float | None = None
    """Restart overhead per interruption, checkpoint read excluded (scheduler, process start, setup)."""
    storage: str | StorageProfile | None = None
    """Storage profile name or path (storage_profiles/), or a profile."""
    checkpoint: str | None = None
    """'blocking' or 'async' (storage_profiles.CHECKPOINT_MODES)."""
    spot_interruptions_per_node_hour: float | None = None
    """Spot reclaims per node-hour (only with spot pricing; no default exists: the user's figure)."""

    def validated(self) -> "ReliabilityInputs":
        """Each given value in range (one ConfigError naming the flag); the storage profile loaded."""
        for flag, value, high in (
            ("mtbf-gpu-hours", self.mtbf_gpu_hours, MAX_MTBF_HOURS),
            ("mtbf-node-hours", self.mtbf_node_hours, MAX_MTBF_HOURS),
            ("restart-s", self.restart_s, MAX_RESTART_S),
            (
                "spot-interruptions-per-node-hour",
                self.spot_interruptions_per_node_hour,
                MAX_SPOT_RATE,
            ),
        ):
            _check_number(flag, value, high, allow_zero=flag == "restart-s")
        if self.checkpoint is not None and self.checkpoint not in CHECKPOINT_MODES:
            raise ConfigError(
                "checkpoint", self.checkpoint, "one of " + ", ".join(CHECKPOINT_MODES)
            )
        storage = self.storage
        if storage is not None and not isinstance(storage, StorageProfile):
            storage = load_storage(str(storage))
        return ReliabilityInputs(
            mtbf_gpu_hours=self.mtbf_gpu_hours,
            mtbf_node_hours=self.mtbf_node_hours,
            restart_s=self.restart_s,
            storage=storage,
            checkpoint=self.checkpoint,
            spot_interruptions_per_node_hour=self.spot_interruptions_per_node_hour,
        )

    @property
    def given(self) -> list[str]:
        """Flags of the values the user set."""
        names = {
            "mtbf_gpu_hours": "--mtbf-gpu-hours",
            "mtbf_node_hours": "--mtbf-node-hours",
            "restart_s": "--restart-s",
            "storage": "--storage",
            "checkpoint": "--checkpoint",
            "spot_interruptions_per_node_hour": "--spot-interruptions-per-node-hour",
        }
        return [flag for key, flag in names.items() if getattr(self, key) is not None]


def _check_number(flag: str, value: float | None, high: float, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    low_ok = value >= 0 if allow_zero else value > 0
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low_ok
        or value > high
    ):
        lower = ">= 0" if allow_zero else "> 0"
        raise ConfigError(flag, value, f"a finite number {lower} and <= {high:g}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointState:
    """What one checkpoint of a plan holds (bytes)."""

    unique_bytes: float
    """Every parameter once, with its optimizer state: params x (param bytes + optimizer bytes)."""
    bytes_per_gpu: float
    """What the largest rank holds of it, sharded as the plan shards it (tensor and pipeline
    parallelism split the parameters; ZeRO >= 1 shards the optimizer state, ZeRO 3 the parameters)."""
    staged_bytes_per_gpu: float
    """What an asynchronous save copies to the host per rank: bytes_per_gpu without an optimizer state
    that already lives there (offload=optimizer)."""


def checkpoint_state(document: Mapping[str, Any]) -> CheckpointState:
    """The plan's model states as a checkpoint stores them: parameters in their training dtype and the
    optimizer state (fp32 master copy and moments; gradients are not saved), per parameter from the
    framework profile (cost_models.memory.state_bytes_per_param, the one owner) and sharded with
    cost_models.memory.zero_sharded over the ZeRO group (dp, or dp_shard under HSDP). Parameters per
    rank are the even share params / (tp x pp)."""

    plan, params = document["plan"], float(document["model"]["params"])
    framework = load_framework(plan.get("framework", "megatron"))
    param_b, _grad_b, optim_b = state_bytes_per_param(
        framework, plan["precision"], plan.get("optimizer", "adamw")
    )
    group = plan.get("dp_shard") or plan["dp"]
    per_rank = params / (plan["tp"] * plan["pp"])
    params_held = float(zero_sharded(per_rank * param_b, group, plan["zero"], 3))
    optim_held = float(zero_sharded(per_rank * optim_b, group, plan["zero"], 1))
    staged = params_held + (0.0 if plan.get("offload") == "optimizer" else optim_held)
    return CheckpointState(
        unique_bytes=params * (param_b + optim_b),
        bytes_per_gpu=params_held + optim_held,
        staged_bytes_per_gpu=staged,
    )


def failure_rates(inputs: ReliabilityInputs, spot: bool) -> tuple[float, float, float]:
    """(per GPU-hour, per node-hour, spot reclaims per node-hour): the user's MTBFs when given, else
    the sourced defaults; spot reclaims only when pricing at spot."""
    if inputs.mtbf_gpu_hours is not None or inputs.mtbf_node_hours is not None:
        gpu = 1.0 / inputs.mtbf_gpu_hours if inputs.mtbf_gpu_hours else 0.0
        node = 1.0 / inputs.mtbf_node_hours if inputs.mtbf_node_hours else 0.0
    else:
        defaults = load_reliability_defaults()
        gpu, node = defaults.failure_rate_per_gpu_hour, defaults.failure_rate_per_node_hour
    spot_rate = (inputs.spot_interruptions_per_node_hour or 0.0) if spot else 0.0
    return gpu, node, spot_rate


@dataclass(frozen=True, kw_only=True, slots=True)
class _Setting:
    """The resolved assumptions: storage, save mode, restart overhead and failure rates."""

    storage: StorageProfile
    mode: str
    restart_overhead_s: float
    rates: tuple[float, float, float]


def _setting(inputs: ReliabilityInputs, spot: bool) -> _Setting:
    inputs = inputs.validated()
    defaults = load_reliability_defaults()
    storage = (
        inputs.storage
        if isinstance(inputs.storage, StorageProfile)
        else load_storage(defaults.storage)
    )
    restart_s = defaults.restart_overhead_s if inputs.restart_s is None else float(inputs.restart_s)
    return _Setting(
        storage=storage,
        mode=inputs.checkpoint or defaults.checkpoint,
        restart_overhead_s=restart_s,
        rates=failure_rates(inputs, spot),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Io:
    write_s: float
    read_s: float
    stall_s: float
    latency_s: float
    mtbf_s: float


def _io(state: CheckpointState, setting: _Setting, hardware, gpus: int, nodes: int) -> _Io:
    """Checkpoint write and read times on the storage (per node: the profile's bandwidth, else the node's
    network; aggregate: the profile's), the stall per save (blocking: the write; async: the copy to host
    memory, cost_models.offload.pcie_Bps, the write finishing in the background), and the job's MTBF."""

    storage = setting.storage
    node_net_Bps = hardware.inter_node_GBps_per_node * 1e9
    write_node = (storage.write_GBps_per_node or 0.0) * 1e9 or node_net_Bps
    read_node = (storage.read_GBps_per_node or 0.0) * 1e9 or node_net_Bps
    write_agg = storage.write_GBps_aggregate * 1e9 if storage.write_GBps_aggregate else None
    read_agg = storage.read_GBps_aggregate * 1e9 if storage.read_GBps_aggregate else None
    write_s = float(R.checkpoint_write_s(state.unique_bytes, nodes, write_node, write_agg))
    read_s = float(
        R.checkpoint_read_s(
            state.bytes_per_gpu,
            gpus,
            min(int(hardware.devices_per_node), gpus),
            read_node,
            read_agg,
        )
    )
    if setting.mode == "async":
        stall_s, latency_s = (
            float(R.staging_s(state.staged_bytes_per_gpu, pcie_Bps(hardware))),
            write_s,
        )
    else:
        stall_s, latency_s = write_s, 0.0
    mtbf_s = float(R.job_mtbf_s(R.job_failure_rate_per_hour(gpus, nodes, *setting.rates)))
    return _Io(write_s=write_s, read_s=read_s, stall_s=stall_s, latency_s=latency_s, mtbf_s=mtbf_s)


def _run(work_s: float, io: _Io, setting: _Setting) -> R.RunReliability:
    with np.errstate(over="ignore"):
        return R.run_with_failures(
            work_s,
            stall_s=io.stall_s,
            restart_s=setting.restart_overhead_s + io.read_s,
            mtbf_s=io.mtbf_s,
            latency_s=io.latency_s,
        )


def reliability_figures(
    document: Mapping[str, Any],
    hardware,
    *,
    tokens: float,
    price_per_hour: float | None,
    inputs: ReliabilityInputs = ReliabilityInputs(),
    spot: bool = False,
) -> dict[str, Any]:
    """prediction.reliability of a plan document for a run of `tokens` tokens (docs/goodput.md).

    W = whole steps x step time; M from the failure rates over the plan's GPUs and nodes; the
    checkpoint (checkpoint_state) written and read at the storage's bandwidths (_io); R = restart
    overhead + read; interval, wall time and goodput from cost_models.reliability.run_with_failures."""
    setting = _setting(inputs, spot)
    plan, hw_doc = document["plan"], document["hardware"]
    gpus, nodes = int(hw_doc["gpus"]), int(hw_doc["nodes"])
    state = checkpoint_state(document)
    io = _io(state, setting, hardware, gpus, nodes)
    steps = math.ceil(tokens / (plan["global_batch"] * plan["seq"]))
    work_s = steps * float(document["prediction"]["step_time_s"])
    run = _run(work_s, io, setting)
    if not (math.isfinite(run.wall_s) and run.goodput >= MIN_GOODPUT):
        raise ConfigError(
            "mtbf",
            io.mtbf_s,
            "a job that runs longer between failures than it takes to restart",
            message=f"the job would be interrupted every {io.mtbf_s:,.3g} s on average ({gpus} GPUs, "
            f"{nodes} nodes) but needs {run.restart_s:,.0f} s to restart and "
            f"{io.stall_s:,.1f} s per checkpoint: goodput below {MIN_GOODPUT:.1%}; check "
            f"--mtbf-gpu-hours, --mtbf-node-hours, --spot-interruptions-per-node-hour and "
            f"--restart-s",
        )
    rate_gpu, rate_node, _ = setting.rates
    figures = {
        "goodput": run.goodput,
        "checkpoint_interval_s": run.interval_s,
        "interval_rule": "daly-2006" if run.interval_s > io.latency_s else "write latency (async)",
        "checkpoint": setting.mode,
        "storage": setting.storage.name,
        "checkpoint_bytes": state.unique_bytes,
        "checkpoint_bytes_per_gpu": state.bytes_per_gpu,
        "checkpoint_write_s": io.write_s,
        "checkpoint_read_s": io.read_s,
        "checkpoint_stall_s": io.stall_s,
        "restart_overhead_s": setting.restart_overhead_s,
        "restart_s": run.restart_s,
        "failure_rate_per_gpu_hour": rate_gpu,
        "failure_rate_per_node_hour": rate_node,
        "spot_interruptions_per_node_hour": inputs.spot_interruptions_per_node_hour
        if spot
        else None,
        "mtbf_hours": io.mtbf_s / R.SECONDS_PER_HOUR,
        "expected_interruptions": run.interruptions,
        "checkpoints": run.checkpoints,
        "lost_hours": run.lost_s / R.SECONDS_PER_HOUR,
        "checkpoint_hours": run.checkpoint_stall_total_s / R.SECONDS_PER_HOUR,
        "time_to_train_s": run.wall_s,
        "time_to_train_without_failures_s": work_s,
    }
    if price_per_hour is not None:
        figures["usd"] = price_per_hour * run.wall_s / R.SECONDS_PER_HOUR
        figures["usd_without_failures"] = price_per_hour * work_s / R.SECONDS_PER_HOUR
        figures["usd_reliability"] = figures["usd"] - figures["usd_without_failures"]
    return figures


def with_reliability(document: dict, figures: Mapping[str, Any]) -> dict:
    """Write the figures into a plan document: plan.checkpoint_interval_s, prediction.goodput,
    prediction.reliability, and `goodput` / `checkpoint_interval_s` at its top (recommend --json)."""
    document["plan"]["checkpoint_interval_s"] = figures["checkpoint_interval_s"]
    document["prediction"]["goodput"] = figures["goodput"]
    document["prediction"]["reliability"] = dict(figures)
    document["goodput"] = figures["goodput"]
    document["checkpoint_interval_s"] = figures["checkpoint_interval_s"]
    return document


def goodput_by_gpus(
    document: Mapping[str, Any],
    hardware,
    gpus,
    *,
    inputs: ReliabilityInputs = ReliabilityInputs(),
    spot: bool = False,
) -> list[float]:
    """Goodput of the plan's model, checkpoint and storage as the cluster grows with data parallelism:
    the checkpoint's unique bytes and each GPU's share stay the plan's, the failure rate grows with the
    GPUs and nodes, and the write spreads over more nodes. For the report's figure."""
    setting = _setting(inputs, spot)
    state = checkpoint_state(document)
    out = []
    for n in gpus:
        n = int(n)
        io = _io(state, setting, hardware, n, math.ceil(n / hardware.devices_per_node))
        out.append(_run(1.0, io, setting).goodput)
    return out
