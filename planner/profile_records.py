"""The records a model profile is made of (one layer's parameters, FLOPs and saved bytes; the whole
model's): what the analytic profiler (planner.profiler) and the meta-device measurement
(planner.module_profiler) both return, kept apart so that neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.parallel import RECOMPUTE as RECOMPUTE_MODES

TOTAL_KINDS = ("embedding", "block", "encoder_block", "head")
"""Layer kinds whose saved bytes make up the activation total (the loss row is the logits transient)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerProfile:
    """One unit of the model (embedding, block, head, loss, or a module of an nn.Module tree)."""

    name: str
    """Module path (e.g. 'layers.3') or a role name ('embedding', 'head', 'loss')."""
    kind: str
    """embedding, block, encoder_block, head, loss (analytic) or the module's class name (measured)."""
    params: int
    """Parameters owned by this unit (a shared tensor is counted in the first unit that owns it)."""
    flops_fwd: float
    """Forward FLOPs per micro-batch."""
    flops_bwd: float
    """Backward FLOPs per micro-batch, recomputation not included."""
    activation_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes saved for backward per micro-batch, by recompute mode (none, selective, full)."""
    recompute_flops: dict[str, float] = field(default_factory=dict)
    """Extra forward FLOPs run during backward, by recompute mode."""

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "params": int(self.params),
            "flops": {
                "forward": float(self.flops_fwd),
                "backward": float(self.flops_bwd),
                "recompute": {k: float(v) for k, v in self.recompute_flops.items()},
            },
            "activations_bytes": {k: int(v) for k, v in self.activation_bytes.items()},
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelProfile:
    """Per-layer profile of one micro-batch of `micro_batch` sequences of `seq` tokens."""

    model: dict
    """Description of the model (name, source, shape) as it appears in the JSON."""
    seq: int
    """Sequence length in tokens."""
    micro_batch: int
    """Sequences per micro-batch."""
    precision: str
    """fp32, amp-bf16, amp-fp16, bf16 or fp8."""
    flash: bool
    """Activations assume a flash/SDPA attention kernel (no s x s probabilities saved)."""
    framework: str = "megatron"
    """The software stack whose kernels the activation bytes follow (frameworks/*.json)."""
    params: int
    """Total parameters, shared tensors counted once."""
    layers: tuple[LayerProfile, ...]
    """Units in execution order."""
    method: str
    """'analytic' (TransformerSpec) or 'meta-device measurement' (nn.Module factory)."""
    extra: dict = field(default_factory=dict)
    """Source-specific extras (logits transient bytes, shared-parameter groups, ...)."""

    @property
    def flops_fwd(self) -> float:
        return float(sum(layer.flops_fwd for layer in self.layers))

    @property
    def flops_bwd(self) -> float:
        return float(sum(layer.flops_bwd for layer in self.layers))

    def activation_bytes(self, recompute: str = "none") -> int:
        """Saved bytes of one micro-batch through the whole model (embedding, blocks, head), what
        estimate reports as activations for dp = tp = pp = 1; the loss row is left out (module docstring)."""
        return int(
            sum(
                layer.activation_bytes.get(recompute, 0)
                for layer in self.layers
                if layer.kind in TOTAL_KINDS or self.method != "analytic"
            )
        )

    def recompute_flops(self, recompute: str) -> float:
        return float(sum(layer.recompute_flops.get(recompute, 0) for layer in self.layers))

    def to_dict(self) -> dict:
        """The contract's `planner profile --json` document."""
        return {
            "model": self.model,
            "params": int(self.params),
            "seq": self.seq,
            "micro_batch": self.micro_batch,
            "precision": self.precision,
            "framework": self.framework,
            "flash_attention": self.flash,
            "method": self.method,
            "flops": {
                "forward": self.flops_fwd,
                "backward": self.flops_bwd,
                "recompute": {m: self.recompute_flops(m) for m in RECOMPUTE_MODES},
            },
            "activations_bytes": {m: self.activation_bytes(m) for m in RECOMPUTE_MODES}
            | self.extra.get("activations", {}),
            "layers": [layer.to_dict() for layer in self.layers],
            **{k: v for k, v in self.extra.items() if k != "activations"},
        }
