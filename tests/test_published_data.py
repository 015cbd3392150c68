"""Format checks for the vendored published training runs (validation/published/*.json, format in FORMAT.md).

Every file is loaded and checked: its sources' fields, each row against the row schema
(benchmarks/published_schema.py `check_row`: keys, types, vocabularies, ranges), then what the schema
cannot say of one key: parallel degrees multiplying to the GPU count (world = dp x tp x pp x cp), the
global batch divisible by dp x micro batch, the pipeline schedule matching pp and virtual stages,
memory and its kind given together, `arch` shapes that build a TransformerSpec. The checker is
exercised on injected malformed rows so that a broken check cannot pass silently.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from benchmarks.published_rows import spec_of
from benchmarks.published_schema import ROW, check_row
from planner.errors import ConfigError

PUBLISHED = Path(__file__).resolve().parents[1] / "validation" / "published"
DENSE_FILES = ("megatron.json", "torchtitan.json", "fsdp.json", "deepspeed.json")
FILES = [PUBLISHED / name for name in DENSE_FILES]
"""The per-stack collections; features.json and moe.json have their own checks (tests/test_published_features.py, tests/test_published_moe.py)."""

SOURCE_KEYS = ("title", "authors_or_owner", "url", "date", "where", "hardware_note", "how_measured")
SLUG = re.compile(r"[A-Za-z0-9._-]+")


def row_problems(row: dict) -> list[str]:
    """Everything wrong with one run row (empty when the row follows FORMAT.md).

    Keys, types, vocabularies and ranges belong to the row schema (benchmarks/published_schema.py,
    whose `check_row` refusal is the one problem of a row it refuses); a source_id missing from
    `sources` and a repeated id are tests/test_published_schema.py's. What is checked here is what
    the schema cannot say of one key: the id's form, the degrees' arithmetic, the pipeline's
    schedule, memory and measurement given together, and an `arch` that builds a model."""
    try:
        check_row(row, "row")
    except ConfigError as err:
        return [str(err)]
    out = []
    if not SLUG.fullmatch(row["id"]):
        out.append(f"id {row['id']!r} is not a short slug")
    dp, micro_batch = row["dp"], row["micro_batch"] or 1  # null: taken as 1 (ROW["micro_batch"])
    if dp * row["tp"] * row["pp"] * row["cp"] != row["gpus"]:
        out.append(f"dp*tp*pp*cp = {dp * row['tp'] * row['pp'] * row['cp']} != gpus {row['gpus']}")
    if row["global_batch"] % (dp * micro_batch):
        out.append(
            f"global_batch {row['global_batch']} not divisible by dp*micro_batch {dp * micro_batch}"
        )
    if dp % row["dp_shard"]:
        out.append(f"dp_shard {row['dp_shard']} does not divide dp {dp}")
    if (dp * row["cp"]) % row["ep"]:
        out.append(f"ep {row['ep']} does not divide dp*cp")
    if row["pp"] == 1 and (row["schedule"] is not None or row["virtual_stages"] != 1):
        out.append("pp=1 with a pipeline schedule or virtual stages")
    if row["pp"] > 1 and row["schedule"] is None:
        out.append("pp>1 without a schedule")
    if row["virtual_stages"] > 1 and row["schedule"] != "interleaved-1f1b":
        out.append("virtual_stages>1 needs the interleaved-1f1b schedule")
    if row["arch"] is not None:
        try:
            spec_of(row)
        except Exception as err:  # ConfigError or TypeError: either is a malformed shape
            out.append(f"arch does not build a TransformerSpec: {err}")
    if row["trained"] and not row["measured"]:
        out.append("a trained row has no measurement")
    if (row["measured_memory_gib"] is None) != (row["memory_kind"] is None):
        out.append("measured_memory_gib and memory_kind must be given together")
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
    for row in doc["runs"]:
        out += [f"{row.get('id')}: {p}" for p in row_problems(row)]
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
    assert {name.removesuffix(".json") for name in DENSE_FILES} <= set(ROW["framework"].allowed)
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


def _arch(key, value):
    def mutate(doc):
        doc["runs"][1]["arch"][key] = value

    return mutate


MALFORMED = [
    ("id slug", _set("id", "llama 3 405b"), "is not a short slug"),
    ("degrees", _set("dp", 3), "!= gpus"),
    ("batch", _set("global_batch", 257), "not divisible by dp*micro_batch"),
    ("schedule", _set("schedule", None), "pp>1 without a schedule"),
    ("empty measurement", _set("measured", {}), "trained row has no measurement"),
    ("memory kind", _set("memory_kind", None), "given together"),
    ("dp_shard", _set("dp_shard", 3), "does not divide dp"),
    ("kv heads", _arch("kv_heads", 7), "does not build a TransformerSpec"),
]
"""One injected row per check kept here (the schema's own refusals: tests/test_published_schema.py)."""


@pytest.mark.parametrize(
    "mutate,expected", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_checker_reports_an_injected_malformed_row(mutate, expected):
    doc = _valid_doc()
    mutate(doc)
    problems = doc_problems(doc)
    assert any(expected in p for p in problems), problems


def test_a_row_the_schema_refuses_is_its_one_problem():
    """The cross-field checks run on rows the schema accepts; a refused row reports the refusal."""
    doc = _valid_doc()
    assert "fp16" not in ROW["precision"].allowed
    doc["runs"][0]["precision"] = "fp16"
    problems = doc_problems(doc)
    assert len(problems) == 1 and "precision='fp16' is invalid" in problems[0], problems
