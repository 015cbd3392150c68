"""What every exporter shares: the `Export` record, the refusal error, the model shape of a plan
document and the blocks per pipeline chunk."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from planner.errors import ConfigError
from planner.estimate import even_stages
from planner.plan import Plan
from planner.spec import MoESpec, TransformerSpec, record_of

_SPEC_FIELDS = frozenset(f.name for f in fields(TransformerSpec)) - {"name", "extras"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    """One exported configuration."""

    format: str
    """The target format (planner.exports.FORMATS)."""
    text: str
    """The file's content: a Python config module, argument lines or JSON."""
    notes: tuple[str, ...] = ()
    """How the run differs from the plan where the target cannot express it exactly (same model,
    same batch, same parallel degrees; only speed or memory may differ)."""


MoE = MoESpec
"""Mixture-of-experts shape, `model.arch["moe"]` of a plan document: the model description's own
record (planner.spec.MoESpec: experts, top_k, expert_ffn, shared_experts, shared_expert_ffn,
first_dense_layers, and the router fields)."""


def cannot(fmt: str, why: str) -> ConfigError:
    """The target cannot run this plan as it stands: an error, not a note (never a config that fails
    at launch or silently runs something else)."""
    return ConfigError(
        "format", fmt, "a target that can run this plan", message=f"cannot export to {fmt}: {why}"
    )


def model_spec(plan: Plan) -> TransformerSpec | None:
    """The model shape the plan was made for (`model.arch`, planner.spec.TransformerSpec fields), or
    None for documents written before plans carried it."""
    model = plan.document.get("model", {})
    arch = model.get("arch")
    if not isinstance(arch, Mapping):
        return None
    return TransformerSpec(
        name=model.get("name", "model"), **{k: v for k, v in arch.items() if k in _SPEC_FIELDS}
    )


def model_moe(plan: Plan) -> MoE | None:
    """The mixture-of-experts shape (`model.arch["moe"]`), None for a dense model."""
    arch = plan.document.get("model", {}).get("arch") or {}
    moe = arch.get("moe")
    return (
        record_of(MoESpec, moe, "model.arch.moe")
        if isinstance(moe, Mapping) and moe.get("experts")
        else None
    )


def require_spec(plan: Plan, fmt: str) -> TransformerSpec:
    """The model shape, or a refusal: a target that builds the model needs all of it."""
    spec = model_spec(plan)
    if spec is None:
        raise cannot(
            fmt,
            "the plan document has no model.arch (the model's full shape), which this "
            "target needs to build the model; re-run `planner estimate --json` or `planner recommend --out`",
        )
    return spec


def blocks(plan: Plan) -> int | None:
    """Transformer blocks the pipeline splits (from the stages, else the document's model)."""
    if plan.config.stages:
        return sum(plan.config.stages)
    model = plan.document.get("model", {})
    return model.get("layers", 0) + model.get("encoder_layers", 0) or None


def chunk_blocks(plan: Plan) -> tuple[int, ...]:
    """Blocks per model chunk in layer order (pp * virtual_stages entries): the plan's stages, or
    the planner's even split (planner.estimate.even_stages) when it gives none."""
    cfg = plan.config
    if cfg.stages:
        return tuple(cfg.stages)
    n = blocks(plan)
    return tuple(even_stages(n, cfg.pp * cfg.virtual_stages)) if n else ()


def dp_replicas(plan: Plan) -> int:
    """Copies of the sharded states: dp / dp_shard (1 for plain ZeRO/FSDP over all dp ranks)."""
    return plan.config.dp // plan.config.shard_group


def steps_between_checkpoints(plan: Plan) -> int | None:
    """plan.checkpoint_interval_s in optimizer steps, using the predicted step time (at least 1)."""
    interval_s = plan.document.get("plan", {}).get("checkpoint_interval_s")
    if not interval_s:
        return None
    return max(1, round(interval_s / plan.prediction.step_time_s))


def header(plan: Plan, target: str) -> list[str]:
    """Comment lines naming the plan and its prediction."""
    p = plan.prediction
    return [
        f"{target} configuration exported by `planner export` from a plan for {plan.model_name} on "
        f"{plan.gpus} x {plan.hardware_name} ({plan.nodes} nodes)",
        f"predicted step {p.step_time_s:.3f} s, peak {p.memory.peak_bytes_per_gpu / 2**30:.1f} GiB per GPU",
    ]


def devices_per_node(plan: Plan) -> int:
    """Processes per node for the launcher."""
    return int(
        plan.document.get("hardware", {}).get("devices_per_node") or max(1, plan.gpus // plan.nodes)
    )


def plain(value: Any) -> Any:
    """JSON-ready copy (tuples become lists)."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
