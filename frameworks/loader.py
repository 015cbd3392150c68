"""Read and validate framework profile files (the boundary where JSON becomes a FrameworkProfile).

Every key is declared once here; an unknown key, a missing key, a wrong type or an out-of-range value
is one ConfigError naming the file and the key. Every cost-relevant value must have an entry in the
file's `sources` object.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

from frameworks.profile import (
    ATTENTION_KERNELS,
    KERNELS,
    LOSS_KERNELS,
    MOE_DISPATCHERS,
    Capabilities,
    FrameworkProfile,
    StateBytes,
)
from planner.errors import ConfigError
from planner.io import read_json
from planner.parallel import FRAMEWORK_FILES, FRAMEWORKS, PRECISIONS

FRAMEWORK_DIR = FRAMEWORK_FILES
SCHEMA_VERSION = "1"

_TOP = {
    "schema_version": str,
    "name": str,
    "description": str,
    "kernels": str,
    "attention": str,
    "loss": str,
    "state_bytes": dict,
    "grads_persist": str,
    "grad_bucket_copy": bool,
    "autocast_weight_cache": bool,
    "overlap_grad_reduce": bool,
    "pp_scatter_gather": bool,
    "zero_bubble_forward_reruns": (int, float),
    "allocator_overhead_fraction": (int, float),
    "expandable_segments": bool,
    "compute_efficiency": (int, float),
    "tp_comm_overlap": bool,
    "selective_recompute": str,
    "fp8_cast_bytes_per_element": (int, float),
    "fp8_weight_cache_bytes": (int, float),
    "capabilities": dict,
    "sources": dict,
}
_OPTIONAL = {
    "moe_dispatcher": str,
    "moe_a2a_overlap": bool,
    "moe_host_sync": bool,
    "overlap_param_gather": bool,
    "overlap_p2p": bool,
    "cuda_graphs": bool,
    "pipeline_host_sync": bool,
    "moe_host_ops_per_layer": (int, float),
    "zero3_max_live_params": (int, float),
    "experts_follow_tp_without_ep": bool,
}
"""Keys a profile may leave out (FrameworkProfile's defaults: alltoall, no overlap, no host sync, 0 extra
host operators per MoE layer, ZeRO-3 gathering whole blocks); sourced when given."""
_SOURCED = (
    "kernels",
    "attention",
    "loss",
    "state_bytes",
    "grads_persist",
    "grad_bucket_copy",
    "autocast_weight_cache",
    "overlap_grad_reduce",
    "pp_scatter_gather",
    "zero_bubble_forward_reruns",
    "allocator_overhead_fraction",
    "expandable_segments",
    "compute_efficiency",
    "tp_comm_overlap",
    "selective_recompute",
    "fp8_cast_bytes_per_element",
    "fp8_weight_cache_bytes",
    "capabilities",
)
_STATE_KEYS = ("param", "grad", "master", "state", "reduce", "gather")


def available_frameworks() -> list[str]:
    """The shipped stacks (planner.parallel.FRAMEWORKS: one file each in this folder)."""
    return list(FRAMEWORKS)


def _fail(origin: str, key: str, value: Any, allowed: str) -> NoReturn:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ConfigError(
        key,
        value,
        allowed,
        message=f"framework profile {origin}: {key}={shown} is invalid: allowed {allowed}",
    )


@lru_cache(maxsize=32)
def load_framework(name_or_path: str) -> FrameworkProfile:
    """A shipped profile by name (planner.parallel.FRAMEWORKS) or a profile file by path."""
    text = str(name_or_path)
    path = FRAMEWORK_DIR / f"{text}.json"
    if "/" in text or text.endswith(".json"):
        path = Path(text).expanduser()
    elif not path.is_file():
        raise ConfigError("framework", text, "one of " + ", ".join(available_frameworks()))
    # planner.io: bounded, strict JSON, never a FIFO or a device (the one reader of input files)
    profile = framework_from_dict(read_json(path, "framework profile"), origin=str(path))
    if path.parent == FRAMEWORK_DIR and profile.name != path.stem:
        _fail(str(path), "name", profile.name, f"{path.stem!r}, the file's name")
    return profile


def framework_from_dict(data: Any, *, origin: str = "<dict>") -> FrameworkProfile:
    if not isinstance(data, dict):
        _fail(origin, "<document>", data, "a JSON object")
    for key in data:
        if key not in _TOP and key not in _OPTIONAL:
            _fail(origin, key, data[key], "known keys: " + ", ".join([*_TOP, *_OPTIONAL]))
    for key, kind in _OPTIONAL.items():
        if key in data and (
            not isinstance(data[key], kind) or (kind is not bool and isinstance(data[key], bool))
        ):
            _fail(
                origin,
                key,
                data[key],
                "a number" if isinstance(kind, tuple) else f"a {kind.__name__}",
            )
    ops = data.get("moe_host_ops_per_layer", 0.0)
    if not (math.isfinite(ops) and 0.0 <= ops <= 1000.0):
        _fail(origin, "moe_host_ops_per_layer", ops, "a number from 0 to 1000")
    live = data.get("zero3_max_live_params")
    if live is not None and not (math.isfinite(live) and 1e6 <= live <= 1e12):
        _fail(origin, "zero3_max_live_params", live, "a parameter count from 1e6 to 1e12")
    if data.get("moe_dispatcher", MOE_DISPATCHERS[0]) not in MOE_DISPATCHERS:
        _fail(
            origin, "moe_dispatcher", data["moe_dispatcher"], "one of " + ", ".join(MOE_DISPATCHERS)
        )
    for key, kind in _TOP.items():
        if key not in data:
            if key == "schema_version":
                continue
            raise ConfigError(
                key,
                None,
                "present",
                message=f"framework profile {origin}: missing required key {key!r}",
            )
        value = data[key]
        if not isinstance(value, kind) or (
            kind is not bool and isinstance(value, bool) and key != "grad_bucket_copy"
        ):
            _fail(origin, key, value, f"a {kind.__name__ if isinstance(kind, type) else 'number'}")
    if data["name"] not in FRAMEWORKS:
        _fail(origin, "name", data["name"], "one of " + ", ".join(FRAMEWORKS))
    if data["kernels"] not in KERNELS:
        _fail(origin, "kernels", data["kernels"], "one of " + ", ".join(KERNELS))
    if data["attention"] not in ATTENTION_KERNELS:
        _fail(origin, "attention", data["attention"], "one of " + ", ".join(ATTENTION_KERNELS))
    if data["loss"] not in LOSS_KERNELS:
        _fail(origin, "loss", data["loss"], "one of " + ", ".join(LOSS_KERNELS))
    if data["grads_persist"] not in ("always", "accumulating"):
        _fail(origin, "grads_persist", data["grads_persist"], "always or accumulating")
    reruns, frag = data["zero_bubble_forward_reruns"], data["allocator_overhead_fraction"]
    if not (math.isfinite(reruns) and 1.0 <= reruns <= 16.0):
        _fail(origin, "zero_bubble_forward_reruns", reruns, "a number from 1 to 16")
    if not (math.isfinite(frag) and 0.0 <= frag <= 1.0):
        _fail(origin, "allocator_overhead_fraction", frag, "a fraction from 0 to 1")
    if data["selective_recompute"] not in ("attention", "op"):
        _fail(origin, "selective_recompute", data["selective_recompute"], "attention or op")
    ce = data["compute_efficiency"]
    if not (math.isfinite(ce) and 0.2 <= ce <= 1.0):
        _fail(origin, "compute_efficiency", ce, "a fraction from 0.2 to 1")
    for key in ("fp8_cast_bytes_per_element", "fp8_weight_cache_bytes"):
        if not (math.isfinite(data[key]) and 0.0 <= data[key] <= 16.0):
            _fail(origin, key, data[key], "bytes from 0 to 16")
    states = {}
    for precision, block in data["state_bytes"].items():
        if precision not in PRECISIONS:
            _fail(
                origin,
                f"state_bytes.{precision}",
                block,
                "precisions among " + ", ".join(PRECISIONS),
            )
        if not isinstance(block, dict) or set(block) != set(_STATE_KEYS):
            _fail(
                origin,
                f"state_bytes.{precision}",
                block,
                "an object with exactly " + ", ".join(_STATE_KEYS),
            )
        for k, v in block.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v <= 16):
                _fail(origin, f"state_bytes.{precision}.{k}", v, "bytes per parameter from 0 to 16")
        states[precision] = StateBytes(**{k: float(v) for k, v in block.items()})
    caps = _capabilities(data["capabilities"], origin)
    if data.get("moe_dispatcher", MOE_DISPATCHERS[0]) not in caps.moe_dispatchers:
        _fail(
            origin,
            "moe_dispatcher",
            data["moe_dispatcher"],
            "one of capabilities.moe_dispatchers (" + ", ".join(caps.moe_dispatchers) + ")",
        )
    if data.get("moe_a2a_overlap", False) and not caps.moe_a2a_overlap:
        _fail(origin, "moe_a2a_overlap", True, "false unless capabilities.moe_a2a_overlap")
    missing = sorted(set(caps.precisions) - set(states))
    if missing:
        _fail(
            origin,
            "state_bytes",
            sorted(states),
            f"an entry for every allowed precision ({', '.join(caps.precisions)})",
        )
    sources = data["sources"]
    for key in _SOURCED + tuple(k for k in _OPTIONAL if k in data):
        if not isinstance(sources.get(key), str) or not sources[key].strip():
            raise ConfigError(
                f"sources.{key}",
                None,
                "a source for every value",
                message=f"framework profile {origin}: missing required key 'sources.{key}'",
            )
    return FrameworkProfile(
        name=data["name"],
        description=data["description"],
        kernels=data["kernels"],
        attention=data["attention"],
        loss=data["loss"],
        state_bytes=states,
        grads_persist=data["grads_persist"],
        grad_bucket_copy=data["grad_bucket_copy"],
        autocast_weight_cache=data["autocast_weight_cache"],
        overlap_grad_reduce=data["overlap_grad_reduce"],
        pp_scatter_gather=data["pp_scatter_gather"],
        zero_bubble_forward_reruns=float(reruns),
        allocator_overhead_fraction=float(frag),
        expandable_segments=data["expandable_segments"],
        compute_efficiency=float(ce),
        tp_comm_overlap=data["tp_comm_overlap"],
        selective_recompute=data["selective_recompute"],
        fp8_cast_bytes_per_element=float(data["fp8_cast_bytes_per_element"]),
        fp8_weight_cache_bytes=float(data["fp8_weight_cache_bytes"]),
        capabilities=caps,
        sources=dict(sources),
        moe_dispatcher=data.get("moe_dispatcher", MOE_DISPATCHERS[0]),
        moe_a2a_overlap=data.get("moe_a2a_overlap", False),
        moe_host_sync=data.get("moe_host_sync", False),
        overlap_param_gather=data.get("overlap_param_gather", False),
        overlap_p2p=data.get("overlap_p2p", False),
        cuda_graphs=data.get("cuda_graphs", False),
        pipeline_host_sync=data.get("pipeline_host_sync", False),
        moe_host_ops_per_layer=float(data.get("moe_host_ops_per_layer", 0.0)),
        zero3_max_live_params=None if live is None else float(live),
        experts_follow_tp_without_ep=data.get("experts_follow_tp_without_ep", False),
    )


_JSON_KINDS = {"bool": bool, "int": int, "str": str}


def _is(value, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _capability(origin: str, declared: Field, value: Any):
    """One capabilities key checked against its declaration (frameworks.profile.capability): its JSON
    type, its vocabulary, its rule; returns the value as Capabilities holds it (lists as tuples)."""
    key = f"capabilities.{declared.name}"
    nullable = declared.type.endswith(" | None")
    kind = declared.type.removesuffix(" | None")
    if value is None and nullable:
        return None
    if kind.startswith("tuple["):
        item = _JSON_KINDS[kind.removeprefix("tuple[").split(",")[0]]
        if not isinstance(value, list) or not all(_is(v, item) for v in value):
            _fail(origin, key, value, "a list" + (" or null" if nullable else ""))
    elif not _is(value, _JSON_KINDS[kind]):
        _fail(origin, key, value, f"a {kind}")
    rule = declared.metadata
    if rule["vocab"] is not None:
        bad = [v for v in (value if isinstance(value, list) else [value]) if v not in rule["vocab"]]
        if bad:
            _fail(origin, key, bad[0], "values among " + ", ".join(map(str, rule["vocab"])))
    if rule["check"] is not None and not rule["check"](value):
        _fail(origin, key, value, rule["allowed"])
    return tuple(value) if isinstance(value, list) else value


def _capabilities(block: dict, origin: str) -> Capabilities:
    declared = {f.name: f for f in fields(Capabilities)}
    for key in block:
        if key not in declared:
            _fail(origin, f"capabilities.{key}", block[key], "known keys: " + ", ".join(declared))
    values = {}
    for name, spec in declared.items():
        if name in block:
            values[name] = _capability(origin, spec, block[name])
        elif spec.default is MISSING:
            raise ConfigError(
                name,
                None,
                "present",
                message=f"framework profile {origin}: missing required key 'capabilities.{name}'",
            )
    return Capabilities(**values)
