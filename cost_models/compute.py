"""Time of the work one device does: GEMMs, attention, memory-bound kernels, the optimizer step.

Every function takes numbers or numpy arrays (broadcasting) and the physical parameters of a
`HardwareProfile` (`efficiency` block, documented in docs/cost-model.md):

- GEMM (roofline with a per-kernel fixed cost; Williams, Waterman & Patterson 2009, "Roofline"):

      t = max( F / (P * e_max) + t0 ,  bytes / BW )          F = 2 m n k (x batch)

  i.e. an efficiency e(F) = e_max / (1 + t0 P e_max / F) that saturates in the GEMM size. e_max
  (large-GEMM efficiency) and t0 (fill/drain + wave-quantization cost of one kernel) are fitted to
  measured GEMMs (H100: validation/h100_train_steps.jsonl, 7 shapes).
- Flash attention (Dao 2023, FlashAttention-2): causal kernels skip the upper triangle, so the
  forward does 2 b s^2 a d / tp FLOPs at `flash_attention_efficiency` of peak; backward 2.5x.
- Memory-bound kernels (norms, activations, dropout, residual adds, casts, softmax/loss):
  t = bytes / BW with BW the measured device-to-device copy bandwidth.
- Optimizer step (AdamW reads/writes ~16-28 bytes per parameter): memory bound, same formula.
- Communication overlapped with compute is not free: NCCL kernels occupy SMs and HBM bandwidth, so
  a fraction `overlap_interference` of the hidden communication time is added (documented default
  0.15, in the 10-25% slowdown of GEMMs co-running with NCCL reported by Wang et al. 2023,
  "Overlap communication with dependent computation via decomposition", Sec. 2; not calibrated:
  the validation rows have no overlapped communication).
"""
from __future__ import annotations

import numpy as np

from hardware_profiles import HardwareProfile
from hardware_profiles.efficiency import efficiency

DTYPE_OF_PRECISION = {"fp32": "fp32", "amp-bf16": "bf16", "amp-fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}
"""Math dtype of the GEMMs under each training precision (fp32 means TF32 off, as PyTorch's default
for matmul)."""

eff = efficiency
"""A physical efficiency parameter of the profile, or its documented default (the typed table
hardware_profiles.efficiency.EFFICIENCY_KEYS)."""


def precisions_supported(hw: HardwareProfile) -> tuple[str, ...]:
    """Training precisions whose math dtype the device has a peak for (V100: no bf16 tensor cores,
    so no amp-bf16 or bf16; fp32 runs everywhere)."""
    return tuple(p for p, dtype in DTYPE_OF_PRECISION.items() if dtype == "fp32" or dtype in hw.peak_tflops)


def default_precision(hw: HardwareProfile) -> str:
    """bf16 mixed precision where the device has faster bf16 than fp32 math, else fp16 with loss
    scaling, else fp32 (a CPU's bf16 is slower than its fp32)."""
    supported = precisions_supported(hw)
    fp32 = hw.peak_tflops.get("fp32", 0.0)
    return next((p for p in ("amp-bf16", "amp-fp16") if p in supported
                 and hw.peak_tflops[DTYPE_OF_PRECISION[p]] > fp32), "fp32")


def peak_flops(hw: HardwareProfile, precision: str) -> float:
    """Dense peak FLOP/s of the math dtype `precision` trains in."""
    dtype = DTYPE_OF_PRECISION[precision]
    table = hw.peak_tflops
    value = table.get(dtype) or table.get("fp32")    # callers check precisions_supported first
    return float(value) * 1e12


def memory_Bps(hw: HardwareProfile) -> float:
    """Achieved bandwidth of streaming (memory-bound) kernels, bytes/s."""
    return hw.memory_bandwidth_GBps * 1e9 * eff(hw, "elementwise_bandwidth_fraction")


def gemm_efficiency_max(hw: HardwareProfile, precision: str) -> float:
    """Large-GEMM fraction of peak: tensor cores (fp16/bf16), or the SIMT fp32 units when TF32 is off
    (a different unit, its own parameter)."""
    return eff(hw, "gemm_efficiency_max_fp32" if precision == "fp32" else "gemm_efficiency_max")


def gemm_seconds(m, n, k, batch=1, *, hw: HardwareProfile, precision: str, elem_bytes: float = 2.0):
    """One (batched) GEMM kernel: max(F / (P e_max) + t0, (m k + k n + m n) batch bytes / BW)."""
    flops = 2.0 * m * n * k * batch
    compute = flops / (peak_flops(hw, precision) * gemm_efficiency_max(hw, precision)) + eff(hw, "gemm_fixed_us") * 1e-6
    traffic = (m * k + k * n + m * n) * batch * elem_bytes / memory_Bps(hw)
    return np.maximum(compute, traffic)


def gemm_fwd_bwd_seconds(m, n, k, batch=1, **kw):
    """(forward, backward) of one GEMM: backward = data gradient (m x n) @ (n x k) plus weight
    gradient (k x m) @ (m x n), each with the same FLOPs as the forward (Narayanan et al. 2021,
    Sec. 5.1: backward = 2x forward)."""
    fwd = gemm_seconds(m, n, k, batch, **kw)
    bwd = gemm_seconds(m, k, n, batch, **kw) + gemm_seconds(k, n, m, batch, **kw)
    return fwd, bwd


def flash_attention_seconds(b, s, heads, d_head, *, causal: bool, hw: HardwareProfile, precision: str):
    """(forward, backward) of a fused attention kernel on `heads` heads of this rank:
    F_fwd = 4 b s^2 a d (x 1/2 causal: the kernel skips masked tiles), F_bwd = 2.5 F_fwd
    (QK^T recomputed in the backward kernel; Dao 2023, Sec. 3.1)."""
    flops_fwd = 4.0 * b * s * s * heads * d_head * (0.5 if causal else 1.0)
    rate = peak_flops(hw, precision) * eff(hw, "flash_attention_efficiency")
    fixed = eff(hw, "gemm_fixed_us") * 1e-6
    return flops_fwd / rate + fixed, 2.5 * flops_fwd / rate + fixed


def memory_bound_seconds(bytes_moved, hw: HardwareProfile):
    """Streaming kernels: bytes read + written / achieved memory bandwidth."""
    return np.asarray(bytes_moved, dtype=float) / memory_Bps(hw)


def optimizer_bytes_per_param(precision: str, optimizer: str, impl: str = "megatron") -> float:
    """Bytes the optimizer step moves per parameter it updates (read + write), memory bound.

    AdamW with fp32 state (amp, fp32): read p, g, m, v (16) + write p, m, v (12) = 28; Megatron's
    fp16/bf16 mixed precision also writes the 2-byte model copy: 30. Pure bf16 (states in bf16):
    read 8 + write 6 = 14. SGD with momentum: read p, g, m + write p, m (5 tensors).
    """
    if optimizer == "sgd":
        return 10.0 if precision == "bf16" else 20.0 + (2.0 if impl == "megatron" and precision.startswith("amp") else 0.0)
    if precision == "bf16":
        return 14.0
    return 28.0 + (2.0 if impl == "megatron" and precision.startswith("amp") else 0.0)


def optimizer_seconds(params_updated, *, precision: str, optimizer: str, hw: HardwareProfile, impl: str = "megatron"):
    """Optimizer step time of the `params_updated` parameters this rank owns."""
    return memory_bound_seconds(params_updated * optimizer_bytes_per_param(precision, optimizer, impl), hw)


def dispatch_seconds(ops, hw: HardwareProfile):
    """Host time to launch `ops` kernels (eager PyTorch dispatch + launch); the device cannot run
    faster than the host issues work (step time >= this)."""
    return np.asarray(ops, dtype=float) * eff(hw, "dispatch_us_per_op") * 1e-6
