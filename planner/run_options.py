"""How the software stack runs a plan, as the user says it: one record from the command line to
`estimate`, the search, the cost terms and the plan document.

Every field is the user's choice; `None` (or False for a switch that is off unless asked) leaves the
framework's default, which `cost_models.step.Software.of` applies in one place. The values are checked
against the framework by `planner.software.software_for`; the plan document's `software` block is read
back into a record by `planner.plan.run_options`.

This module is a leaf: it imports nothing from the project.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

GRAD_REDUCE_BYTES = {"bf16": 2.0, "fp32": 4.0}
"""Bytes per gradient element of each grad_reduce_dtype (a plan document's grad_reduce_bytes)."""


def grad_reduce_dtype_of(nbytes) -> str | None:
    """The grad_reduce_dtype whose gradients take `nbytes` per element; None for any other value."""
    return next((k for k, v in GRAD_REDUCE_BYTES.items() if v == nbytes), None)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """The run's options (cost_models.step.Software documents what each one costs)."""

    attention: str | None = None
    """Attention kernel family (frameworks.ATTENTION_KERNELS); None: the model's config, else the
    framework's."""
    dropout: bool | None = None
    """Dropout layers active; None: the model's config says (off when it says nothing)."""
    overlap_grad_reduce: bool | None = None
    """Data-parallel reduction overlapped with the backward; None: the framework's default."""
    grad_reduce_dtype: str | None = None
    """'bf16' or 'fp32': the dtype gradients are kept and reduced in; None: the framework profile's."""
    loss: str | None = None
    """Cross-entropy kernel (frameworks.LOSS_KERNELS); None: the framework's."""
    tp_comm_overlap: bool | None = None
    """Tensor-parallel collectives overlapped with the GEMMs; None: the framework's default."""
    overlap_param_gather: bool | None = None
    """ZeRO parameter all-gathers run under the previous step's forward (Megatron-Core's
    --overlap-param-gather; FSDP's prefetch); None: the framework's default."""
    overlap_p2p: bool | None = None
    """Pipeline sends overlapped with compute in the interleaved schedule (Megatron-Core's
    overlap_p2p_comm); None: the framework's default."""
    compile: bool = False
    """torch.compile on the blocks."""
    cuda_graphs: bool | None = None
    """Blocks captured as CUDA graphs (Megatron-Core's --enable-cuda-graph / cuda_graph_impl): each
    pass of a block is one graph launch on the host; None: the framework's default."""
    kernels: str | None = None
    """The block implementation when a run swaps the stack's modules for another's
    (frameworks.KERNELS); None: the framework's own."""
    fp8_scaling: str | None = None
    """FP8 scaling recipe (frameworks.profile.FP8_SCALINGS); None: the framework's default."""
    activation_offload_layers: int | None = None
    """With activation offload, how many blocks offload; None: every block."""
    master_weights: str | None = None
    """'fp32' or 'remainder' (cost_models.step.MASTER_WEIGHTS); None: fp32."""
    expandable_segments: bool | None = None
    """PyTorch's allocator with expandable segments; None: the framework launcher's default."""
    fused_norm: bool = False
    """Eager RMSNorms run as one fused kernel (torchtitan's fused_rmsnorm)."""
    recompute_modules: tuple[str, ...] | None = None
    """What selective recomputation re-runs (Megatron-Core's recompute_modules); None: its default."""
    bf16_optimizer: bool = False
    """DeepSpeed's BF16_Optimizer."""
    activation_fp8_input: bool = False
    """The fused SwiGLU keeps its input in FP8 (Megatron-Core's activation_func_fp8_input_store)."""
    train_metrics: int | None = None
    """Cross-entropy train metrics computed over each micro-batch's logits (Composer /
    llm-foundry: 2); None: the framework's (0)."""
    moe_dispatcher: str | None = None
    """Token dispatcher (frameworks.MOE_DISPATCHERS); None: the framework's."""
    moe_a2a_overlap: bool | None = None
    """Expert-parallel exchange beside another micro-batch's compute; None: the framework's default."""
    moe_imbalance: float | None = None
    """Busiest rank's routed tokens over the mean (>= 1); None: cost_models.moe.DEFAULT_IMBALANCE."""
    moe_fp8_dispatch: bool = False
    """Tokens dispatched in FP8 under an FP8 recipe."""
    fp8_param_gather: bool | None = None
    """Under an FP8 recipe with ZeRO >= 1, GEMM weights kept and all-gathered in FP8
    (Megatron-Core's --fp8-param-gather); None: the framework's default."""

    def __post_init__(self) -> None:
        if isinstance(self.recompute_modules, list):
            object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))

    def with_(self, **changes: Any) -> RunOptions:
        """A copy with `changes` applied."""
        return replace(self, **changes)

    def without(self, name: str) -> RunOptions:
        """A copy with the option `name` back at its default."""
        return replace(self, **{name: getattr(_DEFAULT, name)})

    def chosen(self) -> dict[str, Any]:
        """The options the user set (every field that differs from its default), by name."""
        default = _DEFAULT
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    def moe_choices(self) -> dict[str, Any]:
        """The expert-parallel choices the user set (they mean nothing for a dense model)."""
        return {name: value for name, value in self.chosen().items() if name.startswith("moe_")}


_DEFAULT = RunOptions()
