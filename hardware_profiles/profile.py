"""The hardware profile record: one machine type, as the cost models read it (hardware_profiles/loader.py
fills it from a JSON file and validates every key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from hardware_profiles.efficiency import check_efficiency


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
    """Device memory (HBM) bandwidth achievable by a large copy, GB/s (read + write bytes / s)."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s by math dtype: keys among fp32, tf32, fp16, bf16, fp8, mxfp8 (FP8 with
    E8M0 block scales: present where the tensor cores run it, at the fp8 rate), nvfp4 (FP4 E2M1
    with E4M3 block scales: Blackwell's FP4 rate)."""
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
    # --- added fields (all optional in the record so that code building profiles by hand keeps working)
    description: str = ""
    """One line saying what the machine is."""
    memory_bandwidth_peak_GBps: float | None = None
    """Datasheet device-memory bandwidth, GB/s (memory_bandwidth_GBps is what a copy achieves)."""
    intra_node_interconnect: str = ""
    """Name of the intra-node fabric, e.g. 'NVLink 3 via NVSwitch'."""
    inter_node_interconnect: str = ""
    """Name of the network, e.g. 'EFA' or 'InfiniBand HDR'."""
    nics_per_node: int = 1
    """Network interfaces used for training traffic per node."""
    Gbps_per_nic: float | None = None
    """Line rate of one NIC, Gbit/s (inter_node_Gbps_per_node = nics_per_node x Gbps_per_nic)."""
    calibration: dict = field(default_factory=dict)
    """Raw measurements and fitted models written by `planner hardware calibrate` (empty otherwise)."""
    nvlink_domain: int | None = None
    """Devices joined by the fast intra-node fabric when it spans several nodes (GB200 NVL72: 72 GPUs
    on 18 hosts of 4); None means the node (devices_per_node)."""

    @property
    def nvlink_domain_devices(self) -> int:
        """Devices a collective reaches over NVLink / NVSwitch: the NVLink domain, else the node."""
        return self.nvlink_domain or self.devices_per_node

    def __post_init__(self) -> None:
        check_efficiency(self.efficiency, self.name)

    @property
    def inter_node_GBps_per_node(self) -> float:
        return self.inter_node_Gbps_per_node / 8.0

    @property
    def inter_node_GBps_per_device(self) -> float:
        """Network bandwidth share of one device when all devices of the node talk at once, GB/s."""
        return self.inter_node_GBps_per_node / self.devices_per_node
