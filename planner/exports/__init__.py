"""Translate a plan into the configuration of an existing framework, one module per target.

Each exporter is a pure function `Plan -> Export` (the file's text plus notes on what the target
runs differently). What a target cannot run is refused (planner.errors.ConfigError, exit 2) by the
rules in `planner.exports.limits`, one function per target. Targets and the releases they follow
(docs/exports.md has the field-by-field mapping):

- torchtitan 0.3.0: a Python config module (`--module FILE --config planner_job`) returning
  `torchtitan.trainer.Trainer.Config` (planner.exports.torchtitan).
- Megatron-LM, `megatron/training/arguments.py` of megatron-core 0.19.2: `pretrain_gpt.py` arguments
  (planner.exports.megatron).
- fsdp: Hugging Face Accelerate 1.15.0's FSDP/DDP launch config (YAML) with the matching
  transformers 5.23.0 `TrainingArguments` and model config in a commented Python block
  (planner.exports.fsdp).
- DeepSpeed 0.19.8: the config JSON read by `deepspeed.runtime.config.DeepSpeedConfig`
  (planner.exports.deepspeed).
- SageMaker: model parallelism v2 through SageMaker Python SDK v3 (`sagemaker`), or v1 through
  SDK v2's PyTorch estimator (`sagemaker-v1`) (planner.exports.sagemaker).
"""

from __future__ import annotations

import json
from typing import Callable

from planner.errors import ConfigError
from planner.io import dumps_strict
from planner.exports.common import Export, cannot
from planner.exports.deepspeed import to_deepspeed
from planner.exports.fsdp import to_fsdp
from planner.exports.limits import target_limits
from planner.exports.megatron import megatron_layout, to_megatron
from planner.exports.retarget import framework_refusals, retarget
from planner.exports.sagemaker import to_sagemaker, to_sagemaker_v1
from planner.exports.torchtitan import TORCHTITAN_SCHEDULES, to_torchtitan
from planner.plan import Plan

FORMATS = ("torchtitan", "megatron", "fsdp", "deepspeed", "sagemaker", "sagemaker-v1")

EXPORTERS: dict[str, Callable[[Plan], Export]] = {
    "torchtitan": to_torchtitan,
    "megatron": to_megatron,
    "fsdp": to_fsdp,
    "deepspeed": to_deepspeed,
    "sagemaker": to_sagemaker,
    "sagemaker-v1": to_sagemaker_v1,
}


def refusals(fmt: str, plan: Plan) -> list[str]:
    """Every reason `fmt` cannot run `plan`: its framework's capabilities (frameworks.rules, after the
    memory-safe substitutions of planner.exports.retarget) and what the exported file can express
    (planner.exports.limits). Empty: the export succeeds."""
    if fmt not in EXPORTERS:
        raise ConfigError("format", fmt, "one of " + ", ".join(FORMATS))
    return framework_refusals(plan, fmt) + target_limits(fmt, plan)


def export_plan(plan: Plan, fmt: str) -> Export:
    """Dispatch to the exporter of `fmt`; an unknown format is a ConfigError. A plan made for another
    framework than the target's is re-checked against the target's capabilities and re-estimated there
    first (planner.exports.retarget), and the notes say what changed."""
    if fmt not in EXPORTERS:
        raise ConfigError("format", fmt, "one of " + ", ".join(FORMATS))
    reasons = refusals(fmt, plan)
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise cannot(fmt, reasons[0] + more)
    plan, notes = retarget(plan, fmt)
    result = EXPORTERS[fmt](plan)
    notes = tuple(notes) + tuple(result.notes)
    return Export(format=result.format, text=with_notes(fmt, result.text, notes), notes=notes)


JSON_FORMATS = ("deepspeed", "sagemaker", "sagemaker-v1")
"""Targets whose file is JSON (no comments): the notes go in a top-level "planner_notes" list, a key
their
readers ignore (DeepSpeedConfig keeps unknown keys; the SageMaker blocks are read by section)."""


def with_notes(fmt: str, text: str, notes: tuple[str, ...]) -> str:
    """The exported file with every note in it (a header comment line each, or "planner_notes" in
    JSON), so
    that what the target runs differently from the plan travels with the file, not only on
    stderr."""
    if not notes:
        return text
    if fmt in JSON_FORMATS:
        document = {"planner_notes": list(notes), **json.loads(text)}
        return dumps_strict(document, f"{fmt} configuration") + "\n"
    lines = text.split("\n")
    header = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "\n".join(lines[:header] + [f"# note: {note}" for note in notes] + lines[header:])


__all__ = [
    "FORMATS",
    "Export",
    "export_plan",
    "with_notes",
    "refusals",
    "target_limits",
    "cannot",
    "megatron_layout",
    "TORCHTITAN_SCHEDULES",
    "to_torchtitan",
    "to_megatron",
    "to_fsdp",
    "to_deepspeed",
    "to_sagemaker",
    "to_sagemaker_v1",
]
