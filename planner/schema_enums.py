"""The published schemas' value lists, generated from the code that owns each vocabulary.

planner/schemas/plan.schema.json spells out the values a plan document may hold (schedules,
precisions, stacks, kernels, ...), recommend.schema.json the objectives. Each list here is taken
from its one owner in code, and `write()` puts them into the schema, so a value added in code
reaches the published schemas by running `python -m planner.schema_enums`;
tests/test_plan_schema.py fails while the two differ.
"""

from __future__ import annotations

import json
from pathlib import Path

from cost_models.blocks import RECOMPUTE_MODULES
from dataclasses import fields

from cost_models.step import MASTER_WEIGHTS, Software
from frameworks.profile import (
    ATTENTION_KERNELS,
    FP8_SCALINGS,
    KERNELS,
    LOSS_KERNELS,
    MOE_DISPATCHERS,
    ZERO_STAGES,
)
from planner.parallel import (
    CP_COMMS,
    FRAMEWORKS,
    OFFLOAD,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
)
from planner.estimate import written_options
from planner.search.space import OBJECTIVES
from planner.uncertainty import SCALE_BANDS
from storage_profiles.profile import CHECKPOINT_MODES

SCHEMA = Path(__file__).resolve().parent / "schemas" / "plan.schema.json"
RECOMMEND_SCHEMA = SCHEMA.with_name("recommend.schema.json")

_PLAN = ("properties", "plan", "properties")
_SOFTWARE = ("properties", "software", "properties")
CODE_ENUMS: dict[tuple[str, ...], tuple] = {
    (*_PLAN, "schedule"): SCHEDULES,
    (*_PLAN, "zero"): ZERO_STAGES,
    (*_PLAN, "recompute"): RECOMPUTE,
    (*_PLAN, "offload"): OFFLOAD,
    (*_PLAN, "precision"): PRECISIONS,
    (*_PLAN, "optimizer"): OPTIMIZERS,
    (*_PLAN, "cp_comm"): CP_COMMS,
    (*_PLAN, "framework"): FRAMEWORKS,
    (*_SOFTWARE, "framework"): FRAMEWORKS,
    (*_SOFTWARE, "kernels"): KERNELS,
    (*_SOFTWARE, "attention"): ATTENTION_KERNELS,
    (*_SOFTWARE, "loss"): LOSS_KERNELS,
    (*_SOFTWARE, "master_weights"): MASTER_WEIGHTS,
    (*_SOFTWARE, "fp8_scaling"): FP8_SCALINGS,
    (*_SOFTWARE, "recompute_modules", "items"): RECOMPUTE_MODULES,
    (*_SOFTWARE, "moe_dispatcher"): MOE_DISPATCHERS,
    ("properties", "prediction", "properties", "reliability", "properties", "checkpoint"): (
        CHECKPOINT_MODES
    ),
    ("properties", "prediction", "properties", "uncertainty", "properties", "scale"): tuple(
        name for name, _ in SCALE_BANDS
    ),
    ("properties", "search", "properties", "objective"): OBJECTIVES,
}
"""Where each code-owned vocabulary sits in the schema. The schema's other lists are not owned by
code: plan.implementation (a legacy key read and ignored) and software.grad_reduce_bytes (2 or 4
bytes, the JSON numbers both ways)."""
RECOMMEND_ENUMS: dict[tuple[str, ...], tuple] = {("properties", "objective"): OBJECTIVES}
"""The same for recommend.schema.json (its plans are plan.schema.json's, by reference)."""
SCHEMA_ENUMS = {SCHEMA: CODE_ENUMS, RECOMMEND_SCHEMA: RECOMMEND_ENUMS}

_JSON_TYPES = {"bool": "boolean", "str": "string", "int": "integer", "float": "number"}


def _json_type(annotation: str) -> str:
    kind = annotation.removesuffix(" | None")
    return "array" if kind.startswith("tuple[") else _JSON_TYPES[kind]


SOFTWARE_TYPES: dict[str, str] = {
    option.name: _json_type(option.type)
    for option in fields(Software)
    if option.name in written_options()
}
"""The JSON type of every run option a plan's software block records (planner.estimate.
software_block), from its annotation in cost_models.step.Software: a new option reaches the
schema by running this module."""


def node(schema: dict, path: tuple[str, ...]) -> dict:
    for key in path:
        schema = schema[key]
    return schema


def generated(schema: dict, enums: dict | None = None) -> dict:
    """`schema` with every list of `enums` (default CODE_ENUMS) taken from the code."""
    out = json.loads(json.dumps(schema))
    enums = CODE_ENUMS if enums is None else enums
    for path, values in enums.items():
        node(out, path)["enum"] = list(values)
    if enums is CODE_ENUMS:
        software = node(out, _SOFTWARE)
        for name, kind in SOFTWARE_TYPES.items():
            documented = {"description": f"cost_models.step.Software.{name}"}
            software.setdefault(name, documented)["type"] = kind
    return out


def write(path: Path = SCHEMA, enums: dict | None = None) -> None:
    schema = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(generated(schema, enums), indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    for schema_path, schema_enums in SCHEMA_ENUMS.items():
        write(schema_path, schema_enums)
