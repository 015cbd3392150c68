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
from hardware_profiles.efficiency import efficiency


def host_memory_bytes_per_node(hw: HardwareProfile) -> float:
    """Host memory of a node (efficiency key `host_memory_bytes_per_node`, default 1 TiB)."""
    return efficiency(hw, "host_memory_bytes_per_node")


def pcie_Bps(hw: HardwareProfile) -> float:
    """Host<->device bandwidth one device gets while all devices of the node copy at once: nominal
    rate x `pcie_efficiency` (pinned copies reach ~80%) / `devices_per_pcie_uplink` (GPUs sharing a
    switch uplink)."""
    return (
        hw.host_device_GBps
        * 1e9
        * efficiency(hw, "pcie_efficiency")
        / efficiency(hw, "devices_per_pcie_uplink")
    )


def optimizer_offload_seconds(params_on_rank, grad_bytes_per_param, hw: HardwareProfile):
    """Grads down + parameters up over PCIe, plus this rank's share of the host's Adam
    (`cpu_adam_params_per_s_per_node`)."""
    rate = efficiency(hw, "cpu_adam_params_per_s_per_node")
    transfer = params_on_rank * (grad_bytes_per_param + 2.0) / pcie_Bps(hw)
    cpu = params_on_rank / (rate / hw.devices_per_node)
    return transfer + cpu


def activation_offload_seconds(activation_bytes, forward_s, backward_s, hw: HardwareProfile):
    """Exposed time of activation offload: the copies to the host must hide under the forward and
    the copies back under the backward, each window on its own:
    max(0, A / B - t_fwd) + max(0, A / B - t_bwd)."""
    one_way = np.asarray(activation_bytes, dtype=float) / pcie_Bps(hw)
    return np.maximum(0.0, one_way - forward_s) + np.maximum(0.0, one_way - backward_s)


def offloaded_share(x, n_blocks):
    """Share of a rank's saved activations that offload to the host: all of them, or, with Megatron-Core's
    cpu_offloading_num_layers = N (Software.activation_offload_layers; pipeline parallelism excluded, so the
    rank holds every block), N of its blocks (Transformer Engine's CPU offload context pushes the tagged saved
    tensors of the first N layers and reloads each group ahead of its backward; TE cpu_offload.py)."""
    n = x.sw.activation_offload_layers
    share = (
        1.0
        if n is None
        else np.minimum(1.0, n / np.maximum(np.asarray(n_blocks, dtype=float), 1.0))
    )
    return np.where(x.is_offload("activations"), share, 0.0)


def activation_offload_step_seconds(x, activation_volume_bytes, forward_s, backward_s):
    """Exposed time of activation offload in a step (activation_offload_seconds) plus the interference
    of the hidden copies with compute (`overlap_interference` of min(2 A / B_pcie, busy time))."""
    one_step = activation_offload_seconds(activation_volume_bytes, forward_s, backward_s, x.hw)
    hidden = np.minimum(
        2.0 * np.asarray(activation_volume_bytes) / pcie_Bps(x.hw), forward_s + backward_s
    )
    return np.where(
        x.is_offload("activations"),
        one_step + efficiency(x.hw, "overlap_interference") * hidden,
        0.0,
    )
