"""The typed table of a hardware profile's `efficiency` block: every physical parameter the cost
models read, with its unit, default, allowed range and where its value comes from.

One owner: a profile file may hold only keys of `EFFICIENCY_KEYS` (an unknown key is refused at
load, so a misspelt or stale key cannot be silently ignored), each inside its range (a zero GEMM
efficiency or bandwidth would give infinite step times), and the cost models read every value through
`efficiency(hw, key)`. tests/test_efficiency_keys.py checks that every key is read by the cost models
and that every key `planner hardware calibrate` writes is in the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from planner.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class EfficiencyKey:
    """One key of the `efficiency` block."""

    name: str
    unit: str
    """'fraction', 'us', 'bytes', 'ratio', 'count', 'params/s'."""
    default: float | None
    """Value when a profile does not give the key; None means the value of `fallback`."""
    low: float
    """Smallest allowed value (exclusive when `low_open`)."""
    high: float
    """Largest allowed value (inclusive)."""
    low_open: bool = False
    fallback: str | None = None
    """Key whose value is used when this one is absent (e.g. a collective's bus efficiency)."""
    doc: str
    """What the parameter means in the cost model (the function that reads it)."""
    source: str
    """Where the default comes from."""

    def allowed(self) -> str:
        lower = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        return f"a number {lower} and <= {self.high:g} ({self.unit})"


def _fraction(
    name: str,
    default: float | None,
    doc: str,
    source: str,
    *,
    fallback: str | None = None,
    zero_ok: bool = False,
) -> EfficiencyKey:
    return EfficiencyKey(
        name=name,
        unit="fraction",
        default=default,
        low=0.0,
        high=1.0,
        low_open=not zero_ok,
        fallback=fallback,
        doc=doc,
        source=source,
    )


def _bus(
    name: str, default: float | None, doc: str, source: str, *, fallback: str | None = None
) -> EfficiencyKey:
    """A collective's bus bandwidth over the profile's link rate: at most 1 on NVLink/InfiniBand, but
    a calibrated loopback profile (gloo) takes the ping-pong as its link, which a ring collective can
    beat, hence up to 16."""
    return EfficiencyKey(
        name=name,
        unit="ratio",
        default=default,
        low=0.0,
        high=16.0,
        low_open=True,
        fallback=fallback,
        doc=doc,
        source=source,
    )


EFFICIENCY_KEYS: dict[str, EfficiencyKey] = {
    k.name: k
    for k in (
        _fraction(
            "gemm_efficiency_max",
            0.72,
            "large-GEMM fraction of the dense tensor-core peak (cost_models.compute.gemm_seconds)",
            "H100 fit of 5 measured bf16 GEMMs (validation/h100_train_steps.jsonl): 0.739; A100 fit to 8 "
            "published Megatron-LM runs: 0.726; 0.72 when a profile has none",
        ),
        _fraction(
            "gemm_efficiency_max_fp32",
            None,
            "large-GEMM fraction of the fp32 (SIMT, TF32 off) peak (cost_models.compute.gemm_seconds)",
            "fitted on the H100 fp32 training steps (0.80); falls back to gemm_efficiency_max",
            fallback="gemm_efficiency_max",
        ),
        _fraction(
            "gemm_efficiency_max_fp8",
            None,
            "large-GEMM fraction of the dense FP8 tensor-core peak (cost_models.compute.gemm_seconds)",
            "no FP8 GEMM table is published in text (validation/kernels/fp8_gemm.json); fitted to the published "
            "FP8 training runs of the device's generation (benchmarks/calibrate_frameworks.py, leave one source "
            "out); falls back to gemm_efficiency_max",
            fallback="gemm_efficiency_max",
        ),
        EfficiencyKey(
            name="gemm_fixed_us",
            unit="us",
            default=12.0,
            low=0.0,
            high=1e4,
            doc="fixed cost of one GEMM kernel: launch, fill and drain (cost_models.compute.gemm_seconds; wave quantization is gemm_wave_sms's)",
            source="H100 fit of the measured bf16 GEMMs: 13.2 us; 12 when a profile has none",
        ),
        EfficiencyKey(
            name="gemm_wave_sms",
            unit="count",
            default=0.0,
            low=0.0,
            high=1024.0,
            doc="streaming multiprocessors over which a GEMM's 256 x 128 output tiles run in whole waves, so that "
            "a last, partly filled wave costs a full one (cost_models.compute.wave_quantization, GEMMs of at "
            "least one wave); 0: the device's GEMM library hides it",
            source="A100 with cuBLAS 11: 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper) and wave "
            "quantization measured in NVIDIA's 'Matrix Multiplication Background User's Guide'; 0 on "
            "Hopper and later, whose cuBLAS GEMMs stay far above the one-wave bound "
            "(validation/kernels/gemm_h100_xla.json)",
        ),
        _fraction(
            "flash_attention_efficiency",
            0.35,
            "fraction of the dense peak a fused (flash) attention kernel reaches (cost_models.compute.flash_attention_seconds)",
            "Dao 2023 (FlashAttention-2): ~35% of the H100 bf16 peak at head dim 64, 50-73% of A100's",
        ),
        _fraction(
            "fused_attention_efficiency",
            None,
            "fraction of the dense peak a cuDNN / FlashAttention-3-class fused attention kernel reaches at head "
            "dim 128 on long sequences, forward + backward (cost_models.compute.attention_efficiency)",
            "H100: 0.55 from validation/kernels/attention.json (FlashAttention-3 and cuDNN forward 0.62-0.65 at "
            "16k, FA3's backward 1.5-1.75x FA2's per Shah et al. 2024), which Transformer "
            "Engine's forward + backward measurement reproduces within 1% (cuDNN 9.3 at 8k, "
            "head dim 128; its attention example, in the same file); falls back to "
            "flash_attention_efficiency (no such kernel before Hopper)",
            fallback="flash_attention_efficiency",
        ),
        _fraction(
            "mem_efficient_attention_efficiency",
            None,
            "fraction of the fp32 peak PyTorch's memory-efficient SDPA kernel reaches on fp32 inputs "
            "(cost_models.compute.attention_efficiency)",
            "H100: fitted with the other step keys to the 42 H100 training steps of validation/h100_train_steps.jsonl "
            "(its fp32 gpt2 rows run this kernel; benchmarks/calibrate.py); no published fp32 kernel measurement, "
            "so other profiles fall back to flash_attention_efficiency",
            fallback="flash_attention_efficiency",
        ),
        EfficiencyKey(
            name="triton_attention_relative",
            unit="ratio",
            default=0.43,
            low=0.0,
            high=2.0,
            low_open=True,
            doc="long-sequence rate of the 2022-23 Triton FlashAttention (llm-foundry's attn_impl 'triton') over "
            "FlashAttention-2's flash_attention_efficiency, forward + backward (cost_models.compute."
            "attention_efficiency)",
            source="0.43: the Triton curve of FlashAttention-2's README benchmark on A100 (0.42-0.47 of FA2 at "
            "head dim 128, 4k-16k tokens; validation/kernels/attention.json), the Triton kernel the README "
            "benchmarked, not necessarily llm-foundry's fork of flash_attn_triton; shipped profiles hold the value fitted "
            "to the published runs that use the fork (benchmarks/calibrate_frameworks.py)",
        ),
        EfficiencyKey(
            name="attention_seq_half_tokens",
            unit="tokens",
            default=200.0,
            low=0.0,
            high=1e6,
            doc="sequence length at which a non-causal fused attention kernel reaches half its long-sequence "
            "efficiency (cost_models.compute.attention_efficiency)",
            source="fit of the FlashAttention-2/3 curves of validation/kernels/attention.json (H100 and A100): "
            "efficiency = e_max s / (s + s_half), s_half 150-250 non-causal",
        ),
        EfficiencyKey(
            name="attention_seq_half_causal_tokens",
            unit="tokens",
            default=500.0,
            low=0.0,
            high=1e6,
            doc="the same for causal attention, whose diagonal tiles are half empty (cost_models.compute."
            "attention_efficiency)",
            source="fit of the FlashAttention-2/3 causal curves of validation/kernels/attention.json: s_half "
            "450-600",
        ),
        _fraction(
            "sustained_clock_fraction",
            1.0,
            "sustained tensor-core rate over a training run (minutes to hours, every GPU of the node loaded) over "
            "the rate of the short single-GPU benchmarks the generation's GEMM and attention efficiencies were "
            "measured in (cost_models.compute.sustained_flops; MFU keeps the datasheet peak)",
            "1 where the rates were fitted to multi-GPU training runs (A100: Megatron's published Selene runs; "
            "Blackwell: the published runs of benchmarks/calibrate_frameworks.py), which already hold it; Hopper's "
            "rates come from seconds-long single-H100 GEMMs and steps at boost clock (validation/h100_train_steps."
            "jsonl: 788 TFLOP/s at 8192^3, 80% of the 989 TFLOP/s datasheet peak), so Hopper profiles hold the "
            "value fitted to the published multi-GPU runs (benchmarks/calibrate_frameworks.py): boost clocks are "
            "transient, and under sustained dense GEMM load a 700 W part settles to a lower clock within minutes",
        ),
        _fraction(
            "power_limit_clock_fraction",
            1.0,
            "sustained tensor-core rate of a power-capped part over the rate its generation's GEMM and attention "
            "efficiencies were measured at (cost_models.compute.sustained_flops; MFU keeps the datasheet peak)",
            "1: parts run at their datasheet power (H100 SXM 700 W); a cluster whose GPUs run capped (Meta's Grand "
            "Teton H100 96GB at its default 500 W) has it fitted by benchmarks/calibrate_frameworks.py",
        ),
        _fraction(
            "elementwise_bandwidth_fraction",
            1.0,
            "fraction of the measured copy bandwidth that memory-bound kernels stream at (cost_models.compute.memory_Bps)",
            "H100 fit on the 42 eager training steps: 0.743; fused kernels stream at the copy rate (1.0)",
        ),
        EfficiencyKey(
            name="dispatch_us_per_op",
            unit="us",
            default=0.0,
            low=0.0,
            high=1e4,
            doc="host time to dispatch and launch one eager operator (cost_models.compute.dispatch_seconds)",
            source="H100 fit on the 42 eager training steps: 23.7 us (a measured Python-loop GEMM floor is 31 us)",
        ),
        _fraction(
            "overlap_interference",
            0.15,
            "share of communication hidden under compute that still slows the compute, as NCCL kernels take SMs "
            "and memory bandwidth (planner.score data-parallel terms)",
            "Wang et al. 2023 (Overlap communication with dependent computation via decomposition), Sec. 2: "
            "GEMMs co-running with NCCL slow by 10-25%",
            zero_ok=True,
        ),
        _bus(
            "allreduce_bus_efficiency",
            0.8,
            "all-reduce bus bandwidth over the link rate (cost_models.comm.bus_efficiency)",
            "nccl-tests bus bandwidth of large messages reaches ~80% of NVLink/InfiniBand link rates",
        ),
        _bus(
            "allgather_bus_efficiency",
            None,
            "all-gather bus bandwidth over the link rate (cost_models.comm.bus_efficiency)",
            "measured by `planner hardware calibrate`; falls back to allreduce_bus_efficiency",
            fallback="allreduce_bus_efficiency",
        ),
        _bus(
            "reducescatter_bus_efficiency",
            None,
            "reduce-scatter bus bandwidth over the link rate (cost_models.comm.bus_efficiency)",
            "measured by `planner hardware calibrate`; falls back to allreduce_bus_efficiency",
            fallback="allreduce_bus_efficiency",
        ),
        _bus(
            "p2p_bus_efficiency",
            None,
            "point-to-point send bandwidth over the link rate (pipeline p2p, cost_models.comm.bus_efficiency)",
            "measured by `planner hardware calibrate` (ping-pong); falls back to allreduce_bus_efficiency",
            fallback="allreduce_bus_efficiency",
        ),
        _bus(
            "alltoall_bus_efficiency",
            None,
            "all-to-all bus bandwidth over the link rate (cost_models.comm.bus_efficiency)",
            "falls back to allgather_bus_efficiency (same volume per rank, nccl-tests' busbw definition)",
            fallback="allgather_bus_efficiency",
        ),
        EfficiencyKey(
            name="framework_workspace_bytes",
            unit="bytes",
            default=2 * 32 * 2**20,
            low=0.0,
            high=2**40,
            doc="cuBLAS workspaces the caching allocator holds (cost_models.memory.peak_bytes)",
            source="PyTorch on Ampere/Hopper: one 32 MiB cuBLAS workspace per stream that runs GEMMs "
            "(forward stream and autograd thread)",
        ),
        EfficiencyKey(
            name="cuda_context_bytes",
            unit="bytes",
            default=512 * 2**20,
            low=0.0,
            high=2**40,
            doc="CUDA context, kernels and library handles outside the caching allocator (cost_models.memory.fit_margin)",
            source="~0.5 GiB with CUDA 12 on A100/H100 (nvidia-smi for a process that allocated nothing)",
        ),
        EfficiencyKey(
            name="shared_cores_speedup",
            unit="ratio",
            default=1.0,
            low=1.0,
            high=1024.0,
            doc="how much faster one rank runs while others of its node idle, for ranks that share cores "
            "(planner.score bubble; 1 for accelerators)",
            source="written by `planner hardware calibrate` for gloo ranks: ranks x threads / cores",
        ),
        EfficiencyKey(
            name="host_memory_bytes_per_node",
            unit="bytes",
            default=float(2**40),
            low=2**20,
            high=2**50,
            doc="host memory of a node, shared by its devices for offload (cost_models.offload)",
            source="1 TiB: DGX A100's standard configuration (p4d has 1152 GiB, DGX H100 2 TiB)",
        ),
        _fraction(
            "pcie_efficiency",
            0.8,
            "pinned host<->device copy rate over the nominal PCIe rate (cost_models.offload.pcie_Bps)",
            "NVIDIA bandwidthTest: ~25 of 31.5 GB/s on PCIe Gen4 x16",
        ),
        EfficiencyKey(
            name="devices_per_pcie_uplink",
            unit="count",
            default=2.0,
            low=1.0,
            high=64.0,
            doc="GPUs sharing one PCIe switch uplink to the CPU (cost_models.offload.pcie_Bps)",
            source="DGX A100/H100, p4d and p5: two GPUs per PCIe switch (DGX A100 architecture whitepaper)",
        ),
        EfficiencyKey(
            name="cpu_adam_params_per_s_per_node",
            unit="params/s",
            default=2.0e9,
            low=1.0,
            high=1e13,
            low_open=True,
            doc="CPU Adam throughput of one node for optimizer offload (cost_models.offload.optimizer_offload_seconds)",
            source="Ren et al. 2021 (ZeRO-Offload), Sec. 5.1: ~1B parameters per 0.5 s on a many-core host",
        ),
    )
}


def efficiency(hw, name: str) -> float:
    """The profile's value of efficiency key `name`, else its fallback key's, else its default."""
    key = EFFICIENCY_KEYS[name]
    value = hw.efficiency.get(name)
    if value is not None:
        return float(value)
    if key.fallback is not None:
        return efficiency(hw, key.fallback)
    return float(key.default)


def check_efficiency(block: Mapping, origin: str) -> None:
    """Refuse unknown keys and values outside their range, naming the file and the key."""
    if not isinstance(block, Mapping):
        raise ConfigError(
            "efficiency",
            block,
            "an object of named numbers",
            message=f"hardware profile {origin}: efficiency must be an object of named numbers",
        )
    for name, value in block.items():
        key = EFFICIENCY_KEYS.get(name)
        if key is None:
            raise ConfigError(
                f"efficiency.{name}",
                value,
                "one of " + ", ".join(EFFICIENCY_KEYS),
                message=f"hardware profile {origin}: unknown key 'efficiency.{name}': allowed "
                + ", ".join(EFFICIENCY_KEYS),
            )
        number = (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
        too_low = number and (value <= key.low if key.low_open else value < key.low)
        if not number or too_low or value > key.high:
            raise ConfigError(
                f"efficiency.{name}",
                value,
                key.allowed(),
                message=f"hardware profile {origin}: efficiency.{name}={value!r} is invalid: "
                f"allowed {key.allowed()}",
            )
