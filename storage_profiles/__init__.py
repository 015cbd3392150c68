"""Storage profiles and the goodput model's defaults: sourced JSON files beside this module.

A checkpoint is written to (and, after a failure, read back from) some storage; how long that takes
decides how often it pays to checkpoint and how much a failure costs (cost_models.reliability). A
`StorageProfile` gives the bandwidth of one storage service for the whole job (aggregate) and for
one node; `null` in the file means "not the limit" (S3 has no bucket-wide bandwidth; a file system
without a published per-client limit is limited by the node's own network). `ReliabilityDefaults`
holds the failure rates, restart overhead, storage and save mode the planner assumes when the user
gives none. `storage_profiles/loader.py` validates every file: unknown keys refused, every number
sourced.

>>> s = load_storage("fsx-lustre")
>>> s.write_GBps_aggregate, s.write_GBps_per_node
(12.3, None)
>>> load_reliability_defaults().failure_rate_per_gpu_hour
1.2621e-05
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

CHECKPOINT_MODES = ("blocking", "async")
"""blocking: training waits until the checkpoint is on storage; async: training waits only while each
rank copies its state to host memory (torch.distributed.checkpoint.async_save, Megatron --async-save)
and the write runs in the background."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageProfile:
    """Where checkpoints go: bandwidths for the whole job and per node (None: not a limit)."""

    name: str
    description: str
    write_GBps_aggregate: float | None
    """Bandwidth of the storage service for all writers together, GB/s (None: unlimited)."""
    read_GBps_aggregate: float | None
    """Bandwidth for all readers together, GB/s (None: unlimited)."""
    write_GBps_per_node: float | None
    """One node's write bandwidth to the service, GB/s (None: the node's network is the limit)."""
    read_GBps_per_node: float | None
    """One node's read bandwidth, GB/s (None: the node's network)."""
    sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReliabilityDefaults:
    """What the goodput model assumes unless the user says otherwise (reliability_defaults.json)."""

    failure_rate_per_gpu_hour: float
    """Job interruptions caused by one GPU, per GPU-hour."""
    failure_rate_per_node_hour: float
    """Job interruptions caused by one node's other parts (host, network, software), per node-hour."""
    restart_overhead_s: float
    """Seconds from a failure until training runs again, checkpoint read excluded (scheduler, process
    start, communicator setup)."""
    storage: str
    """Name of the default storage profile."""
    checkpoint: str
    """Default save mode (CHECKPOINT_MODES)."""
    sources: Mapping[str, str] = field(default_factory=dict)


def load_storage(name_or_path: str) -> StorageProfile:
    """A validated storage profile by name (storage_profiles/<name>.json) or by path."""
    from storage_profiles.loader import load_storage as _load

    return _load(name_or_path)


def available_storage() -> list[str]:
    """Names of the storage profiles shipped here, sorted."""
    from storage_profiles.loader import available_storage as _available

    return _available()


def load_reliability_defaults() -> ReliabilityDefaults:
    """The shipped defaults (storage_profiles/reliability_defaults.json), validated."""
    from storage_profiles.loader import load_reliability_defaults as _load

    return _load()


__all__ = ["CHECKPOINT_MODES", "StorageProfile", "ReliabilityDefaults", "load_storage", "available_storage",
           "load_reliability_defaults"]
