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

import dataclasses

import numpy as np

from cost_models.blocks import BWD_TRAFFIC_FACTOR, ModuleSac, metric_traffic
from cost_models.blocks import COPY_BWD_TRAFFIC_FACTOR as COPY_BWD
from cost_models.experts import expert_gemm_shapes, permute_bytes_fwd
from cost_models.flops import (
    ATTENTION_CORE_GEMMS,
    GemmShape,
    attention_kernel_flops_fwd,
    block_gemm_shapes,
)
from cost_models.offload import optimizer_offload_seconds
from hardware_profiles import HardwareProfile
from hardware_profiles.efficiency import efficiency
from planner.errors import ConfigError
from planner.parallel import PRECISIONS

DTYPE_OF_PRECISION = {
    "fp32": "fp32",
    "amp-bf16": "bf16",
    "amp-fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8",
}
"""Math dtype of the GEMMs under each training precision (fp32 means TF32 off, as PyTorch's default
for matmul)."""
GEMM_DTYPES = {**DTYPE_OF_PRECISION, "nvfp4": "nvfp4"}
"""The math dtype of a GEMM by the precision it is costed at: a training precision's, or nvfp4, the
linear GEMMs of an FP8-precision run under the nvfp4 recipe (linear_gemm_precision)."""


def linear_gemm_precision(precision: str, fp8_scaling: str) -> str:
    """The precision the blocks' linear GEMMs are costed at: FP4 under the nvfp4 recipe (its fprop,
    dgrad and wgrad; Transformer Engine's NVFP4BlockScaling), else the training precision."""
    return "nvfp4" if precision == "fp8" and fp8_scaling == "nvfp4" else precision


NVFP4_OVER_FP8_GEMM_RATE = 7.161 / 3.764
"""How much faster NVFP4 GEMMs run than MXFP8 ones, at most: 1.90x. Transformer Engine's GEMM
profiling example on a B300 (docs/examples/gemm_profiling: the 12 GEMMs of a hidden 4096 / ffn 16384
layer at 15,872 tokens, operands quantized beforehand) takes 3.764 ms a layer in NVFP4 and 7.161 in
MXFP8, where HGX B300's dense FP4 peak is 2.92x its FP8 (13,125 and 4,500 TFLOP/s): the FP4 tensor
cores' rate is not what binds the kernels. An FP4 GEMM is costed at the FP8 GEMM efficiency of the
FP4 peak, capped at 1.90x the FP8 GEMM rate (B200 and GB200, whose FP4 peak is 2x their FP8, come
out at 0.95 of their FP4 peak's share)."""
NVFP4_CAST_OVER_MXFP8 = (6.453 - 3.764) / (8.984 - 7.161)
"""NVFP4's quantization traffic over MXFP8's, 1.48: the same example's autocast minus pre-quantized
times (2.689 ms against 1.823 per layer). NVFP4 needs each tensor's amax before it quantizes (its
fp32 per-tensor scale: one more read of the 16-bit tensor), and applies a 16-point Hadamard
transform to the wgrad operands and stochastic rounding to the gradients (TE's
NVFP4BlockScaling)."""

MX_SCALE_BYTES_PER_ELEMENT = 1.0 / 32.0
"""An MX block's scale: one E8M0 byte per 32 elements (OCP Microscaling Formats (MX) Specification
v1.0, Sec. 5; Transformer Engine's MXFP8 tensors keep one per block in each orientation)."""

eff = efficiency
"""A physical efficiency parameter of the profile, or its documented default (the typed table
hardware_profiles.efficiency.EFFICIENCY_KEYS)."""


def precisions_supported(hw: HardwareProfile) -> tuple[str, ...]:
    """Training precisions whose math dtype the device has a peak for (V100: no bf16 tensor cores,
    so no amp-bf16 or bf16; fp32 runs everywhere)."""
    return tuple(
        p for p, dtype in DTYPE_OF_PRECISION.items() if dtype == "fp32" or dtype in hw.peak_tflops
    )


def default_precision(hw: HardwareProfile) -> str:
    """bf16 mixed precision where the device has faster bf16 than fp32 math, else fp16 with loss
    scaling, else fp32 (a CPU's bf16 is slower than its fp32)."""
    supported = precisions_supported(hw)
    fp32 = hw.peak_tflops.get("fp32", 0.0)
    return next(
        (
            p
            for p in ("amp-bf16", "amp-fp16")
            if p in supported and hw.peak_tflops[DTYPE_OF_PRECISION[p]] > fp32
        ),
        "fp32",
    )


def resolve_precision(hw, precision: str | None) -> str:
    """The training precision to cost on `hw`: the given one if the device has its math dtype, the
    device's default (default_precision) when None; ConfigError otherwise."""
    if precision is None:
        return default_precision(hw)
    if precision not in PRECISIONS:
        raise ConfigError("precision", precision, "one of " + ", ".join(PRECISIONS))
    supported = precisions_supported(hw)
    if precision not in supported:
        dtype = DTYPE_OF_PRECISION[precision]
        raise ConfigError(
            "precision",
            precision,
            f"one of {', '.join(supported)} on {hw.name}",
            message=(
                f"precision={precision!r} needs {dtype} math, which {hw.name} ({hw.device}) does not have; "
                f"allowed here: {', '.join(supported)}"
            ),
        )
    return precision


def peak_flops(hw: HardwareProfile, precision: str) -> float:
    """Dense peak FLOP/s of the math dtype `precision` trains in."""
    dtype = GEMM_DTYPES[precision]
    table = hw.peak_tflops
    value = table.get(dtype) or table.get("fp32")  # callers check precisions_supported first
    return float(value) * 1e12


def sustained_flops(hw: HardwareProfile, precision: str) -> float:
    """The dense peak the part sustains over a training run: peak_flops x sustained_clock_fraction x
    power_limit_clock_fraction. Tensor-core throughput follows the SM clock; boost clocks are transient, and under
    sustained GEMM load the clock settles lower (sustained_clock_fraction, relative to the short single-GPU
    benchmarks the generation's rates were measured in), lower still where a board power cap is set below the
    datasheet power (power_limit_clock_fraction); memory-bound kernels are not slowed. The GEMM and attention
    efficiencies are fractions of this rate."""
    return (
        peak_flops(hw, precision)
        * eff(hw, "sustained_clock_fraction")
        * eff(hw, "power_limit_clock_fraction")
    )


def short_benchmark(hw: HardwareProfile) -> HardwareProfile:
    """The profile as a short benchmark on an idle part sees it: at boost clock (sustained_clock_fraction 1). For
    measurements of a few seconds per configuration, such as the single-H100 steps of
    validation/h100_train_steps.jsonl that the Hopper rates were fitted to."""
    return dataclasses.replace(hw, efficiency={**hw.efficiency, "sustained_clock_fraction": 1.0})


def memory_Bps(hw: HardwareProfile) -> float:
    """Achieved bandwidth of streaming (memory-bound) kernels, bytes/s."""
    return hw.memory_bandwidth_GBps * 1e9 * eff(hw, "elementwise_bandwidth_fraction")


def gemm_efficiency_max(hw: HardwareProfile, precision: str) -> float:
    """Large-GEMM fraction of peak: tensor cores (fp16/bf16; FP8 has its own parameter), or the SIMT fp32
    units when TF32 is off (a different unit, its own parameter)."""
    if precision == "nvfp4":  # FP4 tensor cores, at most NVFP4_OVER_FP8_GEMM_RATE x FP8's rate
        peaks = hw.peak_tflops
        ceiling = NVFP4_OVER_FP8_GEMM_RATE * peaks["fp8"] / peaks["nvfp4"]
        return eff(hw, "gemm_efficiency_max_fp8") * min(1.0, ceiling)
    key = {"fp32": "gemm_efficiency_max_fp32", "fp8": "gemm_efficiency_max_fp8"}.get(
        precision, "gemm_efficiency_max"
    )
    return eff(hw, key)


GEMM_TILES = ((256, 128), (128, 256))
"""Output tiles of a large tensor-core GEMM (rows x columns), either orientation: the largest cuBLAS tile on
A100, which its large GEMMs run with (NVIDIA, "Matrix Multiplication Background User's Guide", "Dimension
Quantization Effects": 256 x 128 tiles over the A100's 108 SMs)."""


def wave_quantization(m, n, batch, sms):
    """Useful share of the tile waves a GEMM with an m x n output (times `batch`) occupies on `sms`
    multiprocessors: each SM computes one output tile at a time, so ceil(tiles / sms) waves run and the last one
    may be partly empty; tiles on the edge are partly empty too (tile quantization). The better of the two tile
    orientations (NVIDIA, "Matrix Multiplication Background User's Guide": tile and wave quantization):

        q = m n batch / (ceil(ceil(m / tm) ceil(n / tn) batch / sms) x sms x tm tn)

    Only GEMMs with at least a wave of the large tiles: under one, the library takes a smaller tile or splits the
    reduction (the guide's typical tile dimensions; a router's m x 8 output is no 256 x 128 tile), which this
    model does not choose, so q = 1 there. 1 where `sms` is 0 (a library whose GEMMs do not quantize by waves)."""
    if not sms:
        return 1.0
    m, n, batch = (np.asarray(v, dtype=float) for v in (m, n, batch))
    best = np.zeros(np.broadcast(m, n, batch).shape)
    for tm, tn in GEMM_TILES:
        tiles = np.ceil(m / tm) * np.ceil(n / tn) * batch
        waves = np.maximum(np.ceil(tiles / sms), 1.0)
        best = np.maximum(
            best, np.where(tiles >= sms, m * n * batch / (waves * sms * tm * tn), 1.0)
        )
    return best


def gemm_seconds(m, n, k, batch=1, *, hw: HardwareProfile, precision: str, elem_bytes: float = 2.0):
    """One (batched) GEMM kernel: max(F / (P e_max q) + t0, (m k + k n + m n) batch bytes / BW), q the tile waves'
    useful share on tensor cores (wave_quantization; the SIMT fp32 path has other tiles and keeps q = 1)."""
    flops = 2.0 * m * n * k * batch
    q = 1.0 if precision == "fp32" else wave_quantization(m, n, batch, eff(hw, "gemm_wave_sms"))
    compute = (
        flops / (sustained_flops(hw, precision) * gemm_efficiency_max(hw, precision) * q)
        + eff(hw, "gemm_fixed_us") * 1e-6
    )
    traffic = (m * k + k * n + m * n) * batch * elem_bytes / memory_Bps(hw)
    return np.maximum(compute, traffic)


def gemm_fwd_bwd_seconds(m, n, k, batch=1, **kw):
    """(forward, backward) of one GEMM: backward = data gradient (m x n) @ (n x k) plus weight
    gradient (k x m) @ (m x n), each with the same FLOPs as the forward (Narayanan et al. 2021,
    Sec. 5.1: backward = 2x forward)."""
    fwd = gemm_seconds(m, n, k, batch, **kw)
    bwd = gemm_seconds(m, k, n, batch, **kw) + gemm_seconds(k, n, m, batch, **kw)
    return fwd, bwd


ATTENTION_HEAD_DIM_HALF = {"fused": 43.0, "flash": 16.0, "mem_efficient": 16.0}
"""Head dim d0 of the efficiency's head-dim factor d / (d + d0), relative to d = 128: FlashAttention-3 /
cuDNN lose ~20% at d = 64 (0.48-0.50 vs 0.62 forward on H100), FlashAttention-2 ~10% (0.30 vs 0.34);
validation/kernels/attention.json (Dao 2023 Fig. 4-7; Shah et al. 2024 Fig. 5-7)."""
ATTENTION_EFFICIENCY_KEY = {
    "fused": "fused_attention_efficiency",
    "flash": "flash_attention_efficiency",
    "mem_efficient": "mem_efficient_attention_efficiency",
    "triton": "flash_attention_efficiency",
}
ATTENTION_HEAD_DIM_HALF["triton"] = 0.0
ATTENTION_RELATIVE_KEY = {"triton": "triton_attention_relative"}
"""Kernels costed relative to FlashAttention-2's efficiency key, by an efficiency key of their own: the 2022-23
Triton FlashAttention runs at 0.42-0.47 of FlashAttention-2's forward + backward rate at head dim 128 and
4k-16k tokens in FlashAttention-2's README benchmark (causal 74/173, 78/182, 80/189 TFLOP/s; non-causal 93/196,
95/201, 95/203 on A100; validation/kernels/attention.json), with no head-dim dependence (d 64 within 5% of
d 128); that figure is the Triton kernel the README benchmarked, not necessarily llm-foundry's fork, so the shipped
profiles hold the fork's rate
fitted to its published runs (benchmarks/calibrate_frameworks.py)."""
ATTENTION_SEQ_HALF_SCALE = {"triton": 0.5}
"""The Triton kernel reaches half its rate at half FlashAttention-2's length (causal: 0.63 of its 16k rate
at 512 tokens vs FlashAttention-2's 0.52; same figure)."""
ATTENTION_EFFICIENCY_KEY["flash1"] = "flash_attention_efficiency"
ATTENTION_HEAD_DIM_HALF["flash1"] = ATTENTION_HEAD_DIM_HALF["flash"]
FLASH1_RELATIVE = {(64, False): 0.625, (64, True): 0.567, (128, False): 0.409, (128, True): 0.439}
"""FlashAttention-1 (Dao et al. 2022) over FlashAttention-2 (Dao 2023), forward + backward at the
same sequence length, head dim and causality, by (head-dim template, causal): v1 compiles
templates for d <= 32, <= 64 and <= 128 (flash-attn 1.0.x csrc/flash_attn/fmha_api.cpp,
run_fmha_fwd; wider heads are refused, cost_models.step.FLASH1_MAX_HEAD_DIM); the benchmark
measured d 64 and d 128 only, so d <= 64 takes the d 64 rate and 65-128 the d 128 rate. Measured at 16k tokens, the longest, in FlashAttention-2's README benchmark on
A100 (Dao 2023 Fig. 4; validation/kernels/attention.json, fa2-readme-a100, kernels
flash_attention_1 / flash_attention_2, TFLOP/s): d 64: 110/176 non-causal, 97/171 causal; d 128:
83/203 non-causal, 83/189 causal. The H100 figure (Dao 2023 Fig. 7, fa2-readme-h100) gives the
same ratios within 10% (0.568, 0.549; 0.411, 0.418)."""
ATTENTION_SEQ_HALF_SCALE["flash1"] = 0.62
"""FlashAttention-1 reaches half its rate at 0.62 of FlashAttention-2's length: s_half from the
512- and 16k-token bars of each curve, x = e_16k / e_512, s_half = 512 (x - 1) / (1 - x / 32)
(the curve e_max s / (s + s_half) through both points), FA1's over FA2's on the A100
panels where both 512-token bars are printed (fa2-readme-a100): non-causal d 64 111/178 = 0.62,
causal d 64 363/514 = 0.71, causal d 128 274/495 = 0.55; the median, 0.62."""


def relative_rate(hw: HardwareProfile, kernel: str, d_head, *, causal: bool):
    """A kernel's long-sequence rate over FlashAttention-2's (1 for a kernel with an efficiency key
    of its own): the profile's key (ATTENTION_RELATIVE_KEY) or FlashAttention-1's measured ratio
    for its head-dim template and causality (FLASH1_RELATIVE)."""
    if kernel == "flash1":
        small, large = (FLASH1_RELATIVE[(t, bool(causal))] for t in (64, 128))
        return np.where(np.asarray(d_head, dtype=float) <= 64, small, large)
    return eff(hw, ATTENTION_RELATIVE_KEY[kernel]) if kernel in ATTENTION_RELATIVE_KEY else 1.0


def attention_efficiency(hw: HardwareProfile, kernel: str, seq, d_head, *, causal: bool):
    """Fraction of the dense peak a fused attention kernel reaches (forward + backward FLOPs):

        e = e_max(kernel) x r x [d / (d + d0)] / [128 / (128 + d0)] x s / (s + s_half)

    e_max the profile's long-sequence efficiency of the kernel at head dim 128 (ATTENTION_EFFICIENCY_KEY),
    r its rate relative to that key's kernel (relative_rate; 1 for most),
    d0 the kernel's head-dim constant, s the length of the query block a rank processes and s_half
    (`attention_seq_half_tokens`, causal: `attention_seq_half_causal_tokens`) where half of e_max is
    reached: a per-row overhead that long sequences amortize. Fitted to the FlashAttention-2/3 and
    cuDNN curves of validation/kernels/attention.json (tests/test_attention_efficiency.py)."""
    d0 = ATTENTION_HEAD_DIM_HALF[kernel]
    d = np.asarray(d_head, dtype=float)
    s = np.asarray(seq, dtype=float)
    half = eff(
        hw, "attention_seq_half_causal_tokens" if causal else "attention_seq_half_tokens"
    ) * ATTENTION_SEQ_HALF_SCALE.get(kernel, 1.0)
    e_max = eff(hw, ATTENTION_EFFICIENCY_KEY[kernel]) * relative_rate(
        hw, kernel, d_head, causal=causal
    )
    return e_max * (d / (d + d0)) * ((128.0 + d0) / 128.0) * s / (s + half)


DROPOUT_ATTENTION_RATE = (0.80, 0.65)
"""(forward, backward) rate of a fused attention kernel with dropout on its probabilities, over its
rate without: the kernel draws a Philox random number per score on the CUDA cores beside the tensor
cores' matmuls, again in the backward, which rebuilds the mask. Measured on GB200 in BF16 at p =
0.125, for cuDNN 9.24's fused attention and FlashAttention-4 alike: forward 75-85% and backward
60-70% of the no-dropout TFLOP/s, about constant over sequence length (Dao-AILab/flash-attention
pull request 2597, 'FA4 SM100 Dropout Support', 2026-05); the middles here. Not measured on Hopper
or Ampere and applied there as measured on Blackwell (the random numbers' share of a kernel's time
grows with the tensor cores' rate, so older parts may pay less); the math path's dropout is memory
traffic instead (cost_models.blocks). Only kernels whose matmuls run on the tensor cores pay it
(DROPOUT_SLOWED_KERNELS): fp32's memory-efficient kernel does its matmuls on the same CUDA cores, 4
d FLOPs per score against a few integer operations per random number, and its efficiency was fitted
on steps that ran dropout (validation/h100_train_steps.jsonl, GPT-2's 0.1)."""
DROPOUT_SLOWED_KERNELS = frozenset({"fused", "flash", "flash1"})
"""Tensor-core kernels that take dropout (llm-foundry's Triton kernel refuses it)."""


def attention_dropout(dropout: bool, spec) -> bool:
    """Whether the attention probabilities are dropped: the run's dropout, unless the model's config
    names its attention dropout and that is 0 (planner.hf_config.training_defaults: OPT drops its
    residuals only); Megatron's and GPT-2's defaults drop both."""
    return bool(dropout) and float(dict(spec.extras).get("attention_dropout", 1.0)) > 0.0


def flash_attention_seconds(
    b,
    s,
    heads,
    d_head,
    *,
    causal: bool,
    hw: HardwareProfile,
    precision: str,
    kernel: str = "flash",
    cp=1,
    flops_fwd=None,
    dropout: bool = False,
):
    """(forward, backward) of a fused attention kernel on `heads` heads of this rank, over a sequence of
    s split over `cp` context-parallel ranks (load-balanced causal split: each rank does 1/cp of the
    work, in blocks of s/cp queries): F_fwd = 4 b s^2 a d / cp (x 1/2 causal: the kernel skips masked
    tiles), F_bwd = 2.5 F_fwd (QK^T recomputed in the backward kernel; Dao 2023, Sec. 3.1), at
    attention_efficiency of the dense peak. `flops_fwd` overrides the whole-sequence F_fwd of this
    rank's heads (MLA's unequal query and value heads, windowed blocks:
    cost_models.flops.attention_kernel_flops_fwd); with `dropout` on the attention probabilities
    each pass at its DROPOUT_ATTENTION_RATE."""
    cp = np.asarray(cp, dtype=float)
    if flops_fwd is None:
        flops_fwd = 4.0 * b * s * s * heads * d_head * (0.5 if causal else 1.0)
    flops_fwd = flops_fwd / cp
    rate = sustained_flops(hw, precision) * attention_efficiency(
        hw, kernel, s / cp, d_head, causal=causal
    )
    fixed = eff(hw, "gemm_fixed_us") * 1e-6
    slowed = dropout and kernel in DROPOUT_SLOWED_KERNELS
    fwd_rate, bwd_rate = DROPOUT_ATTENTION_RATE if slowed else (1.0, 1.0)
    return flops_fwd / (rate * fwd_rate) + fixed, 2.5 * flops_fwd / (rate * bwd_rate) + fixed


def memory_bound_seconds(bytes_moved, hw: HardwareProfile):
    """Streaming kernels: bytes read + written / achieved memory bandwidth."""
    return np.asarray(bytes_moved, dtype=float) / memory_Bps(hw)


def dispatch_seconds(ops, hw: HardwareProfile):
    """Host time to launch `ops` kernels (eager PyTorch dispatch + launch); the device cannot run
    faster than the host issues work (step time >= this)."""
    return np.asarray(ops, dtype=float) * eff(hw, "dispatch_us_per_op") * 1e-6


# ------------------------------------------------------------------------ step terms (cost_models.step)

from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockSeconds:
    """One transformer block, one micro-batch, on one GPU, without tensor-parallel communication."""

    gemm_fwd: np.ndarray
    gemm_bwd: np.ndarray
    attn_fwd: np.ndarray
    attn_bwd: np.ndarray
    elem_fwd: np.ndarray
    """Memory-bound kernels of the forward (norms, activations, residual adds, ...)."""
    elem_bwd: np.ndarray
    scores_fwd: np.ndarray
    """Part of elem_fwd on the s x s scores (unfused attention): re-run by selective recompute."""
    recompute: np.ndarray
    """Forward work re-run in the backward: selective = attention core, full = the whole forward
    (times the extra passes of zero-bubble schedules that recompute more than once)."""
    expert_fwd: np.ndarray | float = 0.0
    """Part of gemm_fwd spent in an MoE block's routed-expert GEMMs (the expert FFN compute that
    Megatron-Core's expert-parallel overlap runs the exchanges beside; cost_models.moe)."""
    expert_bwd: np.ndarray | float = 0.0
    """Part of gemm_bwd spent in the routed-expert GEMMs."""
    tp_paired_fwd: tuple | None = None
    """Forward seconds of the GEMMs each tensor-parallel collective of the sequence-parallel
    pairs is fused with, by TP_PAIRED_GEMMS group (attention in, attention out, MLP in, MLP out):
    what an overlapped collective can hide under (cost_models.comm.tp_exposed_parts)."""

    @property
    def fwd(self):
        return self.gemm_fwd + self.attn_fwd + self.elem_fwd

    @property
    def bwd(self):
        return self.gemm_bwd + self.attn_bwd + self.elem_bwd

    @property
    def total(self):
        return self.fwd + self.bwd + self.recompute


def recompute_passes(x) -> np.ndarray:
    """Extra forward passes of a recomputed block per micro-batch: 1, or the framework's measured
    count minus one under zero-bubble schedules (torch.distributed.pipelining re-ran a checkpointed
    block's forward ~6 times per micro-batch, docs/executor-notes.md)."""
    reruns = x.sw.framework.zero_bubble_forward_reruns - 1.0
    return np.where(x.is_schedule("zero-bubble") & x.full, reruns, 1.0)


TP_PAIRED_GEMMS = {
    **dict.fromkeys(("wq", "wk", "wv", "wq_a", "wkv_a"), 0),
    "wo": 1,
    **dict.fromkeys(("w1", "w3", "shared_w1", "shared_w3"), 2),
    **dict.fromkeys(("w2", "shared_w2"), 3),
}
"""The group of each GEMM a sequence-parallel collective is decomposed with when the stack overlaps
them (Transformer Engine's userbuffers: ring-exchange all-gathers into the QKV and fc1 GEMMs,
reduce-scatters out of the projection and fc2 ones, the same pairs in the backward through dgrad
and wgrad; torch's async TP: fused_all_gather_matmul and fused_matmul_reduce_scatter on the same
GEMMs): 0 the attention's input projections (MLA's down projections), 1 its output projection,
2 the MLP's (shared experts') input GEMMs, 3 its output GEMM."""

TENSOR_CORE_ALIGN_BYTES = 16
"""cuBLAS runs 16-bit GEMMs on tensor cores at full rate only when every dimension spans a multiple of 16 bytes
(8 fp16/bf16 elements): NVIDIA cuBLAS documentation, "Tensor Core Usage" (the m, n, k and leading-dimension
restrictions), and NVIDIA's "Matrix Multiplication Background User's Guide", "Tensor Core Requirements"."""


def core_gemm_precision(precision: str, d_head, elem_bytes: float) -> str:
    """The precision an unfused attention's batched GEMMs (QK^T over k = head dim, AV producing n = head dim)
    run at: a head dim that is not a whole number of 16-byte groups leaves them off the tensor cores, on the
    CUDA cores at the fp32 rate (gemm_efficiency_max_fp32 of the fp32 peak). BigScience measured it on A100
    with Megatron-DeepSpeed's unfused attention (bigscience tr11-176B-ml chronicles-prequel.md, 2022-02-20 and
    02-23): hidden 14400 with 96 heads (head dim 150) ran at 94 TFLOP/s where hidden 13824 (head dim 144) ran
    at 120 on the same 40 nodes, and 128 heads of 13824 (head dim 108) took 162.7 s per step where 96 heads
    (144) took 124.8: both about 30% of the step for GEMMs that carry under 3% of its FLOPs, the 14-16x of
    the tensor-core rate over the fp32 rate. Fused attention kernels take no such path (FlashAttention and
    cuDNN require the head dim to be a multiple of 8). The measurement is cuBLAS 11 (PyTorch 1.11, CUDA 11.5);
    later cuBLAS releases may run such shapes on tensor cores with narrower loads, at a rate nothing vendored
    measures, so the rule is applied to every device alike."""
    group = TENSOR_CORE_ALIGN_BYTES / elem_bytes
    aligned = np.all(np.mod(np.asarray(d_head, dtype=float), group) == 0)
    return precision if aligned or elem_bytes >= 4 or precision == "fp32" else "fp32"


def block_seconds(x) -> BlockSeconds:
    """Per block and micro-batch: the GEMMs of Megatron's column/row split (cost_models.flops.
    block_gemm_shapes; backward = data + weight gradients, Narayanan et al. 2021 Sec. 5.1; an MoE block's
    routed experts as the busiest rank's grouped GEMMs, cost_models.experts.expert_gemm_shapes), attention
    (a flash kernel, or QK^T and AV as batched GEMMs when unfused), memory-bound kernels as bytes
    streamed / bandwidth (cost_models.blocks tables; backward streams BWD_TRAFFIC_FACTOR x,
    copy-like ops COPY_BWD_TRAFFIC_FACTOR x), and
    recomputation (Korthikanti et al. 2022 Sec. 5: selective re-runs the attention core, full the forward)."""
    linear_kw = dict(hw=x.hw, precision=x.linear_precision, elem_bytes=x.c)
    core_kw = dict(
        hw=x.hw,
        precision=core_gemm_precision(x.attention_precision, x.spec.d_head, x.c),
        elem_bytes=x.c,
    )
    gemm_f = gemm_b = attn_f = attn_b = cast_f = cast_b = expert_f = expert_b = module_f = 0.0
    paired = [0.0] * 4  # forward GEMM seconds by TP_PAIRED_GEMMS group
    modules = x.sac if isinstance(x.sac, ModuleSac) else None
    s_local = x.seq / x.cp
    cast = fp8_cast_bytes(x)
    shapes = block_gemm_shapes(x.spec, x.b, s_local, tp=x.tp)
    if (
        x.spec.moe is not None
    ):  # routed experts as the busiest rank's grouped GEMMs under expert parallelism
        shapes = [g for g in shapes if not g.name.startswith("experts_")] + expert_gemm_shapes(x)
    for g in shapes:
        core = g.name in ATTENTION_CORE_GEMMS
        if core and x.attn_kernel != "math":
            continue
        if core:  # this rank's s/cp queries against all s keys (context parallelism)
            g = (
                GemmShape(g.name, s_local, x.seq, g.k, g.batch)
                if g.name == "qk"
                else GemmShape(g.name, s_local, g.n, x.seq, g.batch)
            )
            f_, b_ = gemm_fwd_bwd_seconds(g.m, g.n, g.k, g.batch, **core_kw)
            attn_f, attn_b = attn_f + f_, attn_b + b_
        else:
            f_, b_ = gemm_fwd_bwd_seconds(g.m, g.n, g.k, g.batch, **linear_kw)
            gemm_f, gemm_b = gemm_f + f_, gemm_b + b_
            if g.name in TP_PAIRED_GEMMS:
                paired[TP_PAIRED_GEMMS[g.name]] = paired[TP_PAIRED_GEMMS[g.name]] + f_
            if g.name.startswith("experts_"):
                expert_f, expert_b = expert_f + f_, expert_b + b_
            if modules is not None and g.name in modules.gemms:
                module_f = (
                    module_f + f_ + cast * (g.m * g.k + g.k * g.n) * g.batch / memory_Bps(x.hw)
                )
            cast_f = cast_f + cast * (g.m * g.k + g.k * g.n) * g.batch
            cast_b = cast_b + cast * g.m * g.n * g.batch
    if x.attn_kernel != "math":
        attn_f, attn_b = flash_attention_seconds(
            x.b,
            x.seq,
            x.spec.heads / x.tp,
            x.spec.d_head,
            causal=x.spec.causal,
            hw=x.hw,
            precision=x.attention_precision,
            kernel=x.attn_kernel,
            cp=x.cp,
            flops_fwd=attention_kernel_flops_fwd(x.spec, x.b, x.seq) / x.tp,
            dropout=attention_dropout(x.sw.dropout, x.spec),
        )
    bw = memory_Bps(x.hw)
    gemm_f, gemm_b = gemm_f + cast_f / bw, gemm_b + cast_b / bw
    elem_f = x.per_token(x.table.traffic_fwd) * x.tokens / bw
    copy_f = x.per_token(x.table.copy_traffic_fwd) * x.tokens / bw  # part of elem_f
    permute_f = 0.0
    if x.spec.moe is not None:  # received tokens regrouped by local expert (cost_models.experts)
        permute_f = permute_bytes_fwd(x) / bw
        elem_f = elem_f + permute_f
    scores_f = x.per_token(x.table.scores_traffic_fwd) * x.tokens / bw
    layer_f = gemm_f + attn_f + elem_f
    # selective: the attention core again (Megatron), or the matmuls and memory-bound ops torchtitan's
    # per-operator policy did not save (Step.sac)
    if modules is not None:  # Megatron-Core's recompute_modules (cost_models.blocks.module_sac)
        selective = (
            (attn_f + scores_f) * modules.core_attn
            + module_f
            + x.per_token(modules.elem) * x.tokens / bw
            + permute_f * modules.moe_layer
        )
    else:
        selective = attn_f + scores_f if x.sac is None else x.sac.gemm_fraction * gemm_f + elem_f
    # full: the share of blocks recomputed (all, or recompute_layers per chunk: Step.full_share)
    rec = np.select(
        [x.full, x.selective], [x.full_share * layer_f, selective], 0.0
    ) * recompute_passes(x)
    k = 1.0 / x.sw.framework.compute_efficiency  # the stack's gaps around its kernels (frameworks)
    return BlockSeconds(
        gemm_fwd=k * gemm_f,
        gemm_bwd=k * gemm_b,
        attn_fwd=k * attn_f,
        attn_bwd=k * attn_b,
        elem_fwd=k * elem_f,
        elem_bwd=k * (BWD_TRAFFIC_FACTOR * elem_f - (BWD_TRAFFIC_FACTOR - COPY_BWD) * copy_f),
        scores_fwd=k * scores_f,
        recompute=k * rec,
        expert_fwd=k * expert_f,
        expert_bwd=k * expert_b,
        tp_paired_fwd=tuple(k * g for g in paired),
    )


def head_seconds(x):
    """Last stage: final norm, LM head GEMM (t x V/tp x h, forward and backward; kept in 16 bits under
    FP8 recipes, as Transformer Engine and torchao leave the output layer) and the vocab-parallel loss's
    memory-bound work (cost_models.blocks.head_table), and the trainer's cross-entropy train
    metrics over the logits after the backward (blocks.metric_traffic; Software.train_metrics)."""
    f_, b_ = gemm_fwd_bwd_seconds(
        x.tokens,
        x.spec.vocab / x.tp,
        x.spec.hidden,
        hw=x.hw,
        precision=x.attention_precision,
        elem_bytes=x.c,
    )
    metrics = x.per_token(metric_traffic(x.spec, x.precision, x.sw.train_metrics))
    memory_bound = (
        (x.per_token(x.head.traffic_fwd) + x.per_token(x.head.traffic_bwd) + metrics)
        * x.tokens
        / memory_Bps(x.hw)
    )
    return (f_ + b_ + memory_bound) / x.sw.framework.compute_efficiency


def embedding_seconds(x, tp_allreduce_s):
    """First stage: the vocab-parallel lookup's all-reduce forward and backward (Megatron) and about
    three streams of the t x h embedding output (lookup, gradient, scatter-add)."""
    return np.where(
        x.tp > 1, 2.0 * tp_allreduce_s, 0.0
    ) + 3.0 * x.tokens * x.spec.hidden * x.c / memory_Bps(x.hw)


def fp8_cast_bytes(x) -> float:
    """Memory traffic per element of a GEMM operand to run it in FP8 (0 in other precisions): the
    framework's `fp8_cast_bytes_per_element` (Transformer Engine's fused cast-transpose reads 2 bytes and
    writes the row- and column-major FP8 copies, 1 + 1; torchao's dynamic tensorwise scaling also reads
    the tensor once for its amax). Each linear GEMM casts its input and weight in the forward and its
    output gradient in the backward (Micikevicius et al. 2022, "FP8 Formats for Deep Learning";
    NVIDIA Transformer Engine docs; validation/kernels/fp8_gemm.json). Rowwise scaling (torchao's rowwise
    recipe) casts each operand twice: the forward scales the input per row and the weight per output
    channel, and the backward GEMMs reduce over the other axis, so the input, the weight and the output
    gradient are scaled and cast again along it (torchao float8 README, "rowwise" recipe; a tensorwise
    scale serves both axes through the transposed copy). MXFP8 quantizes each operand along both
    axes in one pass, as the transposed copy, plus one E8M0 scale byte per 32 elements in each
    orientation (MX_SCALE_BYTES_PER_ELEMENT). NVFP4 costs NVFP4_CAST_OVER_MXFP8 times MXFP8's."""
    if x.precision != "fp8":
        return 0.0
    return cast_bytes_per_element(x.sw.framework, x.sw.fp8_scaling)


def cast_bytes_per_element(framework, scaling: str) -> float:
    """fp8_cast_bytes of a run of `framework` under the FP8 recipe `scaling`."""
    per_element = framework.fp8_cast_bytes_per_element
    mxfp8 = per_element + 2.0 * MX_SCALE_BYTES_PER_ELEMENT
    if scaling == "nvfp4":
        return NVFP4_CAST_OVER_MXFP8 * mxfp8
    if scaling == "mxfp8":
        return mxfp8
    return per_element * (2.0 if scaling == "rowwise" else 1.0)


def optimizer_step_bytes_per_param(states, optimizer: str) -> float:
    """Bytes the optimizer step streams per parameter it updates, from the framework's state layout
    (frameworks.StateBytes): read the fp32 copy (master, or the parameters themselves), the gradient
    and the states; write the fp32 copy and the states, and the 16-bit model copy when there is a
    separate master. AdamW with fp32 states under autocast: 2x4 + 4 + 2x2x4 = 28; Megatron mixed
    precision + 2 = 30; pure bf16 14; SGD with momentum keeps one state."""
    n_states = 2.0 if optimizer == "adamw" else 1.0
    fp32_copy = states.master or states.param
    return (
        2.0 * fp32_copy
        + states.grad
        + 2.0 * n_states * states.state
        + (states.param if states.master else 0.0)
    )


def optimizer_params_updated(x, params_rank):
    """Parameters the rank's optimizer step updates: its own, or with ZeRO >= 1 its shard of the
    dense ones over the shard group and of the routed experts over their expert shard group
    (Megatron-Core's distributed optimizer)."""
    return np.where(
        x.zero >= 1,
        params_rank.dense / x.shard_group + params_rank.expert / x.expert_shard_group,
        params_rank.total,
    )


def optimizer_step_seconds(x, params_rank):
    """The optimizer step of the parameters this rank owns (/dp from ZeRO-1), memory bound; with
    optimizer offload the host's: gradients down, parameters up over PCIe plus CPU Adam (ZeRO-Offload).
    `params_rank` is a cost_models.moe.RankParams: ZeRO shards the dense parameters over the shard group
    and the routed experts over their expert data-parallel shard group (Megatron-Core's distributed
    optimizer)."""
    updated = optimizer_params_updated(x, params_rank)
    states = x.sw.state_bytes(x.precision)
    on_device = memory_bound_seconds(
        updated * optimizer_step_bytes_per_param(states, x.optimizer), x.hw
    )
    step = np.where(
        x.is_offload("optimizer"), optimizer_offload_seconds(updated, states.grad, x.hw), on_device
    )
    if x.sw.bf16_optimizer:
        # BF16_Optimizer.update_hp_grads after every micro-batch's backward, `hp_grad.add_(lp.grad.to(fp32))`:
        # the bf16 gradient read and cast into an fp32 temporary (written, then read back), the fp32 accumulator
        # read and written: 2 + 4 + 4 + 8 = 18 bytes per parameter (pipe/engine.py _exec_backward_pass,
        # bf16_optimizer.py update_hp_grads, v0.6.5; unchanged in current DeepSpeed's _update_hp_grad)
        step = step + memory_bound_seconds(x.m * params_rank.total * (states.param + 16.0), x.hw)
    return step
