"""Framework profiles: one sourced JSON file per software stack beside this module.

A training step costs different amounts on different stacks even on the same GPUs and with the same
parallel degrees: the kernels (Megatron/Transformer Engine fused kernels vs PyTorch eager modules),
the attention kernel, the memory conventions (master weights, gradient dtype, persistent gradient
buffers, allocator fragmentation), what overlaps with what (gradient reduction, FSDP prefetch,
pipeline sends), and which plans the stack can run at all (schedules, ZeRO with pipelining, tensor
and sequence parallelism, offload, recompute granularity, degrees). `FrameworkProfile` is the record
the cost models and the search read; `frameworks/loader.py` validates the files (unknown keys refused,
every value sourced).

>>> fw = load_framework("megatron")
>>> fw.kernels, fw.states("amp-bf16", "adamw")
('fused', (2.0, 4.0, 12.0))
"""

from __future__ import annotations

from frameworks.loader import available_frameworks, load_framework
from frameworks.profile import (
    ATTENTION_KERNELS,
    FP8_SCALINGS,
    KERNELS,
    LOSS_KERNELS,
    MOE_DISPATCHERS,
    SWITCHES_A_STACK_MAY_LACK,
    Capabilities,
    FrameworkProfile,
    StateBytes,
)

__all__ = [
    "FrameworkProfile",
    "StateBytes",
    "Capabilities",
    "load_framework",
    "available_frameworks",
    "KERNELS",
    "ATTENTION_KERNELS",
    "LOSS_KERNELS",
    "FP8_SCALINGS",
    "MOE_DISPATCHERS",
    "SWITCHES_A_STACK_MAY_LACK",
]
