"""The storage profile and reliability-default records (storage_profiles/loader.py fills them from the
JSON files beside this module and validates every key)."""

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
