"""Offload to host memory over PCIe (ZeRO-Offload, Ren et al. 2021, "ZeRO-Offload: Democratizing
Billion-Scale Model Training", Sec. 4): numbers or numpy arrays.

- optimizer offload: fp32 master weights and Adam states live on the host; each step sends the
  gradients down (grad bytes per parameter) and the updated parameters up (2 bytes), and the CPU
  runs Adam. Its time is exposed (after the backward) except what overlaps with the last backward:
  t = Psi (g + 2) / B_pcie + Psi / R_cpu_adam.
- activation offload: saved activations go down during the forward and come back during the
  backward: A / B_pcie each way, each hidden under its own pass; only the excess is exposed.
"""
from __future__ import annotations

import numpy as np

from hardware_profiles import HardwareProfile

CPU_ADAM_PARAMS_PER_S_PER_NODE = 2.0e9
"""CPU-Adam throughput of one node (ZeRO-Offload paper, Sec. 5.1: ~1B parameters per 0.5 s on a
many-core host); overridable by the profile's efficiency key `cpu_adam_params_per_s_per_node`."""


HOST_MEMORY_BYTES_PER_NODE = 2**40
"""Host memory of a training node when the profile does not give `host_memory_bytes_per_node` in its
efficiency block: 1 TiB (DGX A100's standard configuration; p4d has 1152 GiB, DGX H100 2 TiB)."""


def host_memory_bytes_per_node(hw: HardwareProfile) -> float:
    return float(hw.efficiency.get("host_memory_bytes_per_node", HOST_MEMORY_BYTES_PER_NODE))


PCIE_EFFICIENCY = 0.8
"""Pinned host<->device copies reach about 80% of the nominal PCIe rate (e.g. ~25 of 31.5 GB/s on
Gen4 x16 in NVIDIA's bandwidthTest); efficiency key `pcie_efficiency`."""
DEVICES_PER_PCIE_UPLINK = 2
"""GPUs behind one PCIe switch uplink to the CPU on DGX A100/H100, p4d and p5 nodes (two GPUs per
switch, DGX A100 architecture whitepaper): when every GPU offloads at once each gets half; efficiency
key `devices_per_pcie_uplink`."""


def pcie_Bps(hw: HardwareProfile) -> float:
    """Host<->device bandwidth one device gets while all devices of the node copy at once."""
    eff = float(hw.efficiency.get("pcie_efficiency", PCIE_EFFICIENCY))
    share = float(hw.efficiency.get("devices_per_pcie_uplink", DEVICES_PER_PCIE_UPLINK))
    return hw.host_device_GBps * 1e9 * eff / share


def optimizer_offload_seconds(params_on_rank, grad_bytes_per_param, hw: HardwareProfile):
    """Grads down + parameters up over PCIe, plus this rank's share of the host's Adam."""
    rate = float(hw.efficiency.get("cpu_adam_params_per_s_per_node", CPU_ADAM_PARAMS_PER_S_PER_NODE))
    transfer = params_on_rank * (grad_bytes_per_param + 2.0) / pcie_Bps(hw)
    cpu = params_on_rank / (rate / hw.devices_per_node)
    return transfer + cpu


def activation_offload_seconds(activation_bytes, forward_s, backward_s, hw: HardwareProfile):
    """Exposed time of activation offload: the copies to the host must hide under the forward and
    the copies back under the backward, each window on its own:
    max(0, A / B - t_fwd) + max(0, A / B - t_bwd)."""
    one_way = np.asarray(activation_bytes, dtype=float) / pcie_Bps(hw)
    return np.maximum(0.0, one_way - forward_s) + np.maximum(0.0, one_way - backward_s)
