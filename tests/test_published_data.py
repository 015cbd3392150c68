"""Format checks for the vendored published training runs (validation/published/*.json, format in FORMAT.md).

Every file is loaded and checked row by row: required keys and types, parallel degrees multiplying to the GPU
count (world = dp x tp x pp x cp), the global batch divisible by dp x micro batch, each row's source_id present in
`sources`, unique ids, catalog names that exist, `arch` shapes that build a TransformerSpec, and measurements that
are positive. The checker is exercised on injected malformed rows so that a broken check cannot pass silently.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from planner import catalog
from planner.spec import TransformerSpec

PUBLISHED = Path(__file__).resolve().parents[1] / "validation" / "published"
DENSE_FILES = ("megatron.json", "torchtitan.json", "fsdp.json", "deepspeed.json")
FILES = [PUBLISHED / name for name in DENSE_FILES]
"""The per-stack collections; features.json and moe.json have their own checks (tests/test_published_features.py, tests/test_published_moe.py)."""

SOURCE_KEYS = ("title", "authors_or_owner", "url", "date", "where", "hardware_note", "how_measured")
ROW_KEYS = (
    "id",
    "source_id",
    "framework",
    "framework_detail",
    "model",
    "arch",
    "params_published",
    "hardware",
    "gpu",
    "gpus",
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "expert_tp",
    "dp_shard",
    "zero",
    "virtual_stages",
    "schedule",
    "micro_batch",
    "global_batch",
    "seq",
    "recompute",
    "sequence_parallel",
    "precision",
    "attention",
    "compile",
    "offload",
    "extras",
    "measured",
    "measured_memory_gib",
    "memory_kind",
    "trained",
    "inferred",
    "notes",
)
OPTIONAL_ROW_KEYS = ("recompute_detail",)
ARCH_KEYS = (
    "model_type",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "position",
    "gated_mlp",
    "activation",
    "norm",
    "tied_embeddings",
    "qkv_bias",
    "out_bias",
    "mlp_bias",
)
INT_KEYS = (
    "gpus",
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "expert_tp",
    "dp_shard",
    "virtual_stages",
    "micro_batch",
    "global_batch",
    "seq",
)
ENUMS = {
    "framework": {"megatron", "torchtitan", "fsdp", "deepspeed"},
    "zero": {0, 1, 2, 3},
    "schedule": {"1f1b", "interleaved-1f1b", "gpipe", "zero-bubble", None},
    "recompute": {"none", "selective", "full"},
    "precision": {"amp-bf16", "bf16", "amp-fp16", "fp8"},
    "attention": {"flash", "flash1", "sdpa", "triton", "unfused", "cudnn", None},
    "offload": {"none", "optimizer", "params", "activations"},
    "memory_kind": {"allocated", "reserved", "nvidia-smi", None},
}
MEASURED_KEYS = {
    "iteration_time_s",
    "tokens_per_s_per_gpu",
    "tokens_per_s",
    "tflops_per_gpu",
    "mfu",
    "hfu",
    "samples_per_s",
}
SPEC_FIELDS = {f.name for f in fields(TransformerSpec)}
CATALOG_NAMES = set(catalog.names())


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def arch_problems(arch: dict, seq: int) -> list[str]:
    """Problems of one `arch` object: the FORMAT.md keys present, only TransformerSpec fields, and a spec that builds."""
    out = [f"arch lacks {k}" for k in ARCH_KEYS if k not in arch]
    unknown = set(arch) - SPEC_FIELDS - {"moe"}
    if unknown:
        out.append(f"arch has keys that are not TransformerSpec fields: {sorted(unknown)}")
    if not out:
        spec_args = {k: v for k, v in arch.items() if k != "moe"}
        try:
            spec = TransformerSpec(name="published", seq=seq, **spec_args)
        except Exception as err:  # ConfigError or TypeError: either is a malformed shape
            return [f"arch does not build a TransformerSpec: {err}"]
        if spec.n_kv_heads and spec.heads % spec.n_kv_heads:
            out.append("arch kv_heads does not divide heads")
    return out


def row_problems(row: dict, sources: dict) -> list[str]:
    """Everything wrong with one run row (empty when the row follows FORMAT.md)."""
    out = [f"missing key {k}" for k in ROW_KEYS if k not in row]
    out += [f"unknown key {k}" for k in row if k not in ROW_KEYS and k not in OPTIONAL_ROW_KEYS]
    if out:
        return out
    if not isinstance(row["id"], str) or not re.fullmatch(r"[A-Za-z0-9._-]+", row["id"]):
        out.append(f"id {row['id']!r} is not a short slug")
    if row["source_id"] not in sources:
        out.append(f"source_id {row['source_id']!r} not in sources")
    for key, allowed in ENUMS.items():
        if row[key] not in allowed:
            out.append(f"{key}={row[key]!r} not one of {sorted(map(str, allowed))}")
    for key in INT_KEYS:
        if not _is_int(row[key]) or row[key] < 1:
            out.append(f"{key}={row[key]!r} is not a positive integer")
    for key in ("sequence_parallel", "compile", "trained"):
        if not isinstance(row[key], bool):
            out.append(f"{key} is not a boolean")
    for key in ("framework_detail", "hardware", "gpu", "notes"):
        if not isinstance(row[key], str):
            out.append(f"{key} is not a string")
    if out:
        return out
    if row["dp"] * row["tp"] * row["pp"] * row["cp"] != row["gpus"]:
        out.append(
            f"dp*tp*pp*cp = {row['dp'] * row['tp'] * row['pp'] * row['cp']} != gpus {row['gpus']}"
        )
    if row["global_batch"] % (row["dp"] * row["micro_batch"]):
        out.append(
            f"global_batch {row['global_batch']} not divisible by dp*micro_batch {row['dp'] * row['micro_batch']}"
        )
    if row["dp"] % row["dp_shard"]:
        out.append(f"dp_shard {row['dp_shard']} does not divide dp {row['dp']}")
    if (row["dp"] * row["cp"]) % row["ep"]:
        out.append(f"ep {row['ep']} does not divide dp*cp")
    if row["pp"] == 1 and (row["schedule"] is not None or row["virtual_stages"] != 1):
        out.append("pp=1 with a pipeline schedule or virtual stages")
    if row["pp"] > 1 and row["schedule"] is None:
        out.append("pp>1 without a schedule")
    if row["virtual_stages"] > 1 and row["schedule"] != "interleaved-1f1b":
        out.append("virtual_stages>1 needs the interleaved-1f1b schedule")
    if row["model"] is None and row["arch"] is None:
        out.append("neither model nor arch given")
    if row["model"] is not None and row["model"] not in CATALOG_NAMES:
        out.append(f"model {row['model']!r} is not a catalog name")
    if row["arch"] is not None:
        out += (
            arch_problems(row["arch"], row["seq"])
            if isinstance(row["arch"], dict)
            else ["arch is not an object"]
        )
    if row["params_published"] is not None and (
        not _is_number(row["params_published"]) or row["params_published"] <= 0
    ):
        out.append("params_published is not a positive number")
    for key in ("extras", "measured", "inferred"):
        if not isinstance(row[key], dict):
            out.append(f"{key} is not an object")
    if out:
        return out
    if any(
        not isinstance(k, str) or not isinstance(v, str) or not v
        for k, v in row["inferred"].items()
    ):
        out.append("inferred must map keys to non-empty explanations")
    unknown_measures = set(row["measured"]) - MEASURED_KEYS
    if unknown_measures:
        out.append(f"unknown measured keys {sorted(unknown_measures)}")
    for key, value in row["measured"].items():
        if not _is_number(value) or value <= 0:
            out.append(f"measured {key}={value!r} is not a positive number")
        elif key in ("mfu", "hfu") and value > 1:
            out.append(f"measured {key}={value} is above 1 (write fractions, not percent)")
    if row["trained"] and not row["measured"]:
        out.append("a trained row has no measurement")
    mem, kind = row["measured_memory_gib"], row["memory_kind"]
    if (mem is None) != (kind is None):
        out.append("measured_memory_gib and memory_kind must be given together")
    if mem is not None and (not _is_number(mem) or mem <= 0):
        out.append("measured_memory_gib is not a positive number")
    if row["recompute"] == "none" and "recompute_detail" in row:
        out.append("recompute_detail without recomputation")
    return out


def doc_problems(doc: dict) -> list[str]:
    """Everything wrong with one published-runs document (empty when it follows FORMAT.md)."""
    out = [
        f"missing top-level key {k}"
        for k in ("about", "sources", "runs", "excluded")
        if k not in doc
    ]
    if out:
        return out
    if not isinstance(doc["about"], str) or not doc["about"]:
        out.append("about is empty")
    for sid, src in doc["sources"].items():
        missing = [k for k in SOURCE_KEYS if not isinstance(src.get(k), str) or not src.get(k)]
        if missing:
            out.append(f"source {sid} lacks {missing}")
        if isinstance(src.get("date"), str) and not re.fullmatch(r"\d{4}(-\d{2})?", src["date"]):
            out.append(f"source {sid} date {src['date']!r} is not YYYY or YYYY-MM")
    ids = [r.get("id") for r in doc["runs"]]
    out += [f"duplicate id {i}" for i in sorted({i for i in ids if ids.count(i) > 1}, key=str)]
    for row in doc["runs"]:
        out += [f"{row.get('id')}: {p}" for p in row_problems(row, doc["sources"])]
    used = {r.get("source_id") for r in doc["runs"]}
    out += [f"source {sid} has no rows" for sid in doc["sources"] if sid not in used]
    for item in doc["excluded"]:
        if set(item) != {"what", "why"} or not all(isinstance(v, str) and v for v in item.values()):
            out.append(f"excluded entry {item!r} needs non-empty what and why")
    return out


def _load(name: str) -> dict:
    return json.loads((PUBLISHED / name).read_text(encoding="utf-8"))


def test_published_files_follow_the_format():
    """Every published file (one table-driven check; each failing file named with its problems)."""
    wrong = {
        path.name: p
        for path in FILES
        if (p := doc_problems(json.loads(path.read_text(encoding="utf-8"))))
    }
    assert FILES and wrong == {}, wrong


def test_dense_files_have_rows_of_their_own_stack_from_several_sources():
    wrong = {}
    for name in DENSE_FILES:
        doc = _load(name)
        frameworks = {r["framework"] for r in doc["runs"]}
        if frameworks != {name.removesuffix(".json")}:
            wrong[name] = f"frameworks {sorted(frameworks)}"
        elif len(doc["sources"]) < 3 or len(doc["runs"]) < 15:
            wrong[name] = f"{len(doc['sources'])} sources, {len(doc['runs'])} runs"
    assert DENSE_FILES and wrong == {}, wrong


def test_megatron_file_holds_h100_runs_at_128_to_2048_gpus():
    """The scaling rows the issue names: NeMo/Megatron-Core runs on H100 from 128 to 2048 GPUs."""
    gpus = {r["gpus"] for r in _load("megatron.json")["runs"] if r["gpu"].startswith("H100")}
    assert {128, 256, 512, 1024, 2048} <= gpus


def test_fsdp_file_holds_h100_runs_from_under_1b_to_70b_and_long_sequences():
    rows = [r for r in _load("fsdp.json")["runs"] if r["gpu"].startswith("H100")]
    sizes = {r["params_published"] for r in rows if r["params_published"]}
    assert min(sizes) < 1e9 and max(sizes) > 6e10
    assert {32768, 65536} <= {r["seq"] for r in rows}


# ---------------------------------------------------------------------------------------------- the checker itself
def _valid_doc() -> dict:
    doc = _load("torchtitan.json")
    row = next(r for r in doc["runs"] if r["pp"] > 1)
    arch_row = copy.deepcopy(row)
    arch_row["id"] = "arch-row"
    arch_row["model"] = None
    arch_row["arch"] = {
        "model_type": "llama",
        "layers": 126,
        "hidden": 16384,
        "heads": 128,
        "kv_heads": 8,
        "head_dim": 128,
        "ffn": 53248,
        "vocab": 128256,
        "position": "rope",
        "gated_mlp": True,
        "activation": "silu",
        "norm": "rmsnorm",
        "tied_embeddings": False,
        "qkv_bias": False,
        "out_bias": False,
        "mlp_bias": False,
    }
    return {
        "about": doc["about"],
        "sources": {row["source_id"]: doc["sources"][row["source_id"]]},
        "runs": [row, arch_row],
        "excluded": [],
    }


def test_checker_accepts_a_well_formed_document():
    assert doc_problems(_valid_doc()) == []


def _set(key, value):
    def mutate(doc):
        doc["runs"][0][key] = value

    return mutate


def _drop(key):
    def mutate(doc):
        del doc["runs"][0][key]

    return mutate


def _arch(key, value):
    def mutate(doc):
        doc["runs"][1]["arch"][key] = value

    return mutate


def _duplicate(doc):
    doc["runs"][1]["id"] = doc["runs"][0]["id"]


def _unknown_source(doc):
    doc["runs"][0]["source_id"] = "nowhere-2099"


MALFORMED = [
    ("missing key", _drop("global_batch"), "missing key global_batch"),
    ("degrees", _set("dp", 3), "!= gpus"),
    ("batch", _set("global_batch", 257), "not divisible by dp*micro_batch"),
    ("source", _unknown_source, "not in sources"),
    ("duplicate id", _duplicate, "duplicate id"),
    ("catalog", _set("model", "llama9-1t"), "not a catalog name"),
    ("precision", _set("precision", "fp16"), "precision='fp16'"),
    ("float gpus", _set("gpus", 512.0), "gpus=512.0 is not a positive integer"),
    ("schedule", _set("schedule", None), "pp>1 without a schedule"),
    ("percent mfu", _set("measured", {"mfu": 41.3}), "above 1"),
    ("empty measurement", _set("measured", {}), "trained row has no measurement"),
    ("memory kind", _set("memory_kind", None), "given together"),
    ("dp_shard", _set("dp_shard", 3), "does not divide dp"),
    ("arch key", _arch("vocab", None), "does not build a TransformerSpec"),
    ("arch field", _arch("n_embd", 4096), "not TransformerSpec fields"),
    ("kv heads", _arch("kv_heads", 7), "does not build a TransformerSpec"),
]


@pytest.mark.parametrize(
    "mutate,expected", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_checker_reports_an_injected_malformed_row(mutate, expected):
    doc = _valid_doc()
    mutate(doc)
    problems = doc_problems(doc)
    assert any(expected in p for p in problems), problems
