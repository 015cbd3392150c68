"""Read and validate framework profile files (the boundary where JSON becomes a FrameworkProfile).

Every key is declared once here (FRAMEWORK_KEYS, planner.data_schema Fields; the capabilities in
frameworks/profile.py); an unknown key, a missing key, a wrong type or an out-of-range value
is one ConfigError naming the file and the key. Every cost-relevant value must have an entry in the
file's `sources` object.
"""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

from frameworks.profile import (
    ATTENTION_KERNELS,
    CAPABILITY_FIELDS,
    FP8_SCALINGS,
    KERNELS,
    LOSS_KERNELS,
    MOE_DISPATCHERS,
    SWITCHES_A_STACK_MAY_LACK,
    Capabilities,
    FrameworkProfile,
    StateBytes,
)
from planner.data_schema import Field, check_document, check_sources
from planner.errors import ConfigError
from planner.io import read_json
from planner.parallel import FRAMEWORK_FILES, FRAMEWORKS, PRECISIONS

FRAMEWORK_DIR = FRAMEWORK_FILES
SCHEMA_VERSION = "1"


def _sourced(kind: str, doc: str, **more) -> Field:
    """A cost-relevant key: the file's `sources` must say where its value comes from."""
    return Field(kind=kind, sourced=True, doc=doc, **more)


def _optional(kind: str, default, doc: str, **more) -> Field:
    """A key a profile may leave out (FrameworkProfile's default); sourced when given."""
    return Field(kind=kind, required=False, default=default, sourced=True, doc=doc, **more)


_BYTES = dict(low=0, high=16, unit="bytes")
_STATE_KEYS = ("param", "grad", "master", "state", "reduce", "gather")
STATE_BYTES = {
    precision: Field(
        kind="object",
        required=False,
        fields={
            key: Field(kind="number", doc=f"StateBytes.{key}.", **{**_BYTES, "unit": "bytes/param"})
            for key in _STATE_KEYS
        },
        doc=f"Bytes per parameter kept in {precision} (frameworks.profile.StateBytes).",
    )
    for precision in PRECISIONS
}
"""The `state_bytes` block: one entry per precision (each precision of capabilities.precisions
required: framework_from_dict)."""

FRAMEWORK_KEYS: dict[str, Field] = {
    "schema_version": Field(kind="str", required=False, doc="File format version ('1')."),
    "name": Field(kind="str", allowed=FRAMEWORKS, doc="The stack (the file's name when shipped)."),
    "description": Field(kind="str", doc="Which training stacks the profile stands for."),
    "kernels": _sourced("str", "Block implementation.", allowed=KERNELS),
    "attention": _sourced("str", "Default attention kernel.", allowed=ATTENTION_KERNELS),
    "loss": _sourced("str", "Default cross-entropy implementation.", allowed=LOSS_KERNELS),
    "state_bytes": _sourced("object", "Bytes per parameter by precision.", fields=STATE_BYTES),
    "grads_persist": _sourced(
        "str",
        "'always' (a contiguous gradient buffer) or 'accumulating' (freed by zero_grad).",
        allowed=("always", "accumulating"),
    ),
    "grad_bucket_copy": _sourced("bool", "DDP copies gradients into its buckets."),
    "autocast_weight_cache": _sourced("bool", "torch.autocast keeps 16-bit GEMM weight copies."),
    "overlap_grad_reduce": _sourced("bool", "The data-parallel reduction overlaps the backward."),
    "pp_scatter_gather": _sourced("bool", "Pipeline sends carry 1/tp and all-gather it."),
    "zero_bubble_forward_reruns": _sourced(
        "number", "Forwards per micro-batch of a recomputed block (zero bubble).", low=1, high=16
    ),
    "allocator_overhead_fraction": _sourced(
        "number",
        "Caching-allocator blocks beyond their tensors (reserved/allocated - 1).",
        low=0,
        high=1,
    ),
    "expandable_segments": _sourced("bool", "The launcher sets expandable_segments:True."),
    "compute_efficiency": _sourced(
        "number", "Fraction of the kernel rates the stack's blocks reach (fitted).", low=0.2, high=1
    ),
    "tp_comm_overlap": _sourced("bool", "Tensor-parallel collectives overlap the GEMMs."),
    "selective_recompute": _sourced(
        "str",
        "What recompute=selective means: the attention core or per-operator.",
        allowed=("attention", "op"),
    ),
    "fp8_cast_bytes_per_element": _sourced(
        "number", "Memory traffic per GEMM operand element to run it in FP8.", **_BYTES
    ),
    "fp8_weight_cache_bytes": _sourced(
        "number", "FP8 weight copies kept for the step, per weight.", **_BYTES
    ),
    "capabilities": _sourced(
        "object", "What the stack can run (the table below).", fields=CAPABILITY_FIELDS
    ),
    "sources": Field(kind="strings", doc="Where each cost-relevant value comes from, by key."),
    "moe_dispatcher": _optional(
        "str",
        MOE_DISPATCHERS[0],
        "Default expert-parallel token dispatcher (one of capabilities.moe_dispatchers).",
        allowed=MOE_DISPATCHERS,
    ),
    "moe_a2a_overlap": _optional(
        "bool", False, "Expert-parallel exchanges overlap other micro-batches by default."
    ),
    "fp8_scaling": _optional(
        "str",
        FP8_SCALINGS[0],
        "Default FP8 scaling recipe (one of capabilities.fp8_scalings).",
        allowed=FP8_SCALINGS,
    ),
    "moe_host_sync": _optional("bool", False, "A dropless MoE forward waits on the host."),
    "tp_backward_async": _optional(
        "bool",
        False,
        "The column-parallel backward runs its tensor-parallel collectives beside its GEMMs.",
    ),
    "overlap_param_gather": _optional(
        "bool", False, "The distributed optimizer's all-gather runs under the next forward."
    ),
    "overlap_p2p": _optional("bool", False, "Interleaved pipeline sends run beside compute."),
    "cuda_graphs": _optional("bool", False, "Blocks run as captured CUDA graphs by default."),
    "fp8_param_gather": _optional(
        "bool", False, "FP8 recipes keep and gather the GEMM weights in FP8 by default (ZeRO >= 1)."
    ),
    "fp8_tp_gather": _optional(
        "list",
        [],
        "FP8 recipes whose sequence-parallel all-gathers carry the quantized tensors.",
        items="str",
        allowed=FP8_SCALINGS,
    ),
    "megatron_legacy_layer": _optional(
        "bool", False, "The dense block is legacy Megatron's eager ParallelTransformerLayer."
    ),
    "pipeline_host_sync": _optional(
        "bool", False, "The host waits for the device before every pipeline operation."
    ),
    "moe_host_ops_per_layer": _optional(
        "number", 0.0, "Host operators an MoE layer's forward adds.", low=0, high=1000
    ),
    "shard_per_block": _optional(
        "bool", False, "ZeRO 2-3 gathers and reduces each block in collectives of its own."
    ),
    "grad_bucket_params": _optional(
        "list",
        None,
        "Gradient bucket in parameters: [floor, per data-parallel rank] (absent: DDP's 25 MiB).",
        items="number",
    ),
    "zero3_max_live_params": _optional(
        "number",
        None,
        "ZeRO-3 gathers by submodule up to this many parameters (absent: by block).",
        low=1e6,
        high=1e12,
        unit="parameters",
    ),
    "experts_follow_tp_without_ep": _optional(
        "bool", False, "Without ep the routed experts are sharded over the TP ranks."
    ),
}
"""Every key of a framework profile file (planner.data_schema; frameworks.profile.FrameworkProfile
says more of each)."""
WHAT = "framework profile"


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
    """Validate a decoded framework profile (FRAMEWORK_KEYS, the capabilities' rules, a state-bytes
    entry per allowed precision, a source per value) and build the record."""
    check_document(data, FRAMEWORK_KEYS, origin, WHAT)
    states = {
        precision: StateBytes(**{k: float(v) for k, v in block.items()})
        for precision, block in data["state_bytes"].items()
    }
    caps = _capabilities(data["capabilities"], origin)
    if data["attention"] not in caps.attention_kernels:
        _fail(
            origin,
            "attention",
            data["attention"],
            "one of capabilities.attention_kernels (" + ", ".join(caps.attention_kernels) + ")",
        )
    if data.get("moe_dispatcher", MOE_DISPATCHERS[0]) not in caps.moe_dispatchers:
        _fail(
            origin,
            "moe_dispatcher",
            data["moe_dispatcher"],
            "one of capabilities.moe_dispatchers (" + ", ".join(caps.moe_dispatchers) + ")",
        )
    fp8_default = data.get("fp8_scaling", FP8_SCALINGS[0])
    if "fp8" in caps.precisions and fp8_default not in caps.fp8_scalings:
        _fail(
            origin,
            "fp8_scaling",
            fp8_default,
            "one of capabilities.fp8_scalings (" + ", ".join(caps.fp8_scalings) + ")",
        )
    quantized_gathers = data.get("fp8_tp_gather", [])
    if not set(quantized_gathers) <= set(caps.fp8_scalings):
        _fail(origin, "fp8_tp_gather", quantized_gathers, "recipes of capabilities.fp8_scalings")
    if data.get("moe_a2a_overlap", False) and not caps.moe_a2a_overlap:
        _fail(origin, "moe_a2a_overlap", True, "false unless capabilities.moe_a2a_overlap")
    bucket = data.get("grad_bucket_params")
    if bucket is not None and (len(bucket) != 2 or bucket[0] < 1e6 or bucket[1] < 0):
        _fail(
            origin,
            "grad_bucket_params",
            bucket,
            "[floor >= 1e6 parameters, parameters per data-parallel rank >= 0]",
        )
    for switch in SWITCHES_A_STACK_MAY_LACK:  # a default on only where the stack has it
        if data.get(switch, False) and not getattr(caps, switch):
            _fail(origin, switch, True, f"false unless capabilities.{switch}")
    missing = sorted(set(caps.precisions) - set(states))
    if missing:
        _fail(
            origin,
            "state_bytes",
            sorted(states),
            f"an entry for every allowed precision ({', '.join(caps.precisions)})",
        )
    check_sources(data, FRAMEWORK_KEYS, origin, WHAT, nulls=True)
    plain = {
        name: _plain_value(declared, data.get(name, declared.default))
        for name, declared in FRAMEWORK_KEYS.items()
        if name not in _BUILT_APART
    }
    return FrameworkProfile(
        **plain, state_bytes=states, capabilities=caps, sources=dict(data["sources"])
    )


_BUILT_APART = ("schema_version", "state_bytes", "capabilities", "sources")
"""FRAMEWORK_KEYS that are not a plain FrameworkProfile value (every other key is one, by the same
name: a new key is declared in FRAMEWORK_KEYS and frameworks.profile.FrameworkProfile only)."""


def _plain_value(declared, value):
    """A key's value as the record holds it: JSON numbers as floats, lists as tuples."""
    if declared.kind == "list" and value is not None:
        return tuple(value)
    return float(value) if declared.kind == "number" and value is not None else value


def _capabilities(block: dict, origin: str) -> Capabilities:
    """The capabilities block, its declared types already checked (FRAMEWORK_KEYS holds
    CAPABILITY_FIELDS), against each declared rule (frameworks.profile.capability's `check`)."""
    for declared in fields(Capabilities):
        value, rule = block.get(declared.name), declared.metadata
        if value is not None and rule["check"] is not None and not rule["check"](value):
            _fail(origin, f"capabilities.{declared.name}", value, rule["allowed"])
    return Capabilities(**{k: tuple(v) if isinstance(v, list) else v for k, v in block.items()})
