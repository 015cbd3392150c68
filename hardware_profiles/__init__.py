"""Hardware profiles: one JSON file per machine type beside this module, units in every key.

`load_profile(name_or_path) -> HardwareProfile` validates on load and raises ConfigError naming
the bad key. The record below is the contract the cost models read; the loader fills it.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareProfile:
    """One machine type (a node of `devices_per_node` accelerators)."""

    name: str
    """Profile name, e.g. 'p4d.24xlarge'."""
    device: str
    """Accelerator model, e.g. 'NVIDIA A100-SXM4-40GB'."""
    devices_per_node: int
    """Accelerators per node."""
    memory_bytes: int
    """Device memory the framework can allocate (usable capacity, not the marketing number)."""
    memory_bandwidth_GBps: float
    """Device memory (HBM) bandwidth achievable by a large copy, GB/s."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s by math dtype: keys among fp32, tf32, fp16, bf16, fp8."""
    intra_node_GBps_per_device: float
    """Unidirectional NVLink/NVSwitch (or PCIe) bandwidth per device inside a node, GB/s."""
    intra_node_latency_us: float
    """Per-message latency of an intra-node collective step, microseconds."""
    inter_node_Gbps_per_node: float
    """Aggregate network bandwidth out of one node (NICs x Gbps), Gbit/s."""
    inter_node_latency_us: float
    """Per-message latency of an inter-node collective step, microseconds."""
    host_device_GBps: float
    """Host<->device bandwidth per device for offload (PCIe), GB/s."""
    price_usd_per_hour: float | None = None
    """On-demand price of one node, USD/hour (None if not sold by the hour)."""
    spot_price_usd_per_hour: float | None = None
    """Spot price of one node, USD/hour, where known."""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Calibrated physical efficiency parameters (GEMM curve, collective bus efficiency, ...)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each number comes from, by key."""

    @property
    def inter_node_GBps_per_node(self) -> float:
        return self.inter_node_Gbps_per_node / 8.0
