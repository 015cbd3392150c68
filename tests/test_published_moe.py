"""Format checks of the vendored MoE data: published runs (validation/published/moe.json, format in
validation/published/FORMAT.md), model facts and HF config fixtures (validation/models/), and the
reliability facts (validation/reliability/reliability.json).

Each validator returns a list of problems; the tests assert the shipped files have none and that a
deliberately broken copy is caught, so a validator that accepts everything fails here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VALID = ROOT / "validation"
MOE_RUNS = VALID / "published" / "moe.json"
MOE_MODELS = VALID / "models" / "moe_models.json"
HF_DIR = VALID / "models" / "hf_configs"
RELIABILITY = VALID / "reliability" / "reliability.json"

ROW_KEYS = {
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
}
NEVER_NULL = {
    "id",
    "source_id",
    "framework",
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
    "global_batch",
    "seq",
    "recompute",
    "sequence_parallel",
    "precision",
    "compile",
    "offload",
    "extras",
    "measured",
    "trained",
    "inferred",
}
SOURCE_KEYS = {"title", "authors_or_owner", "url", "date", "where", "hardware_note", "how_measured"}
FRAMEWORKS = {"megatron", "torchtitan", "fsdp", "deepspeed"}
SCHEDULES = {"1f1b", "interleaved-1f1b", "gpipe", "zero-bubble", None}
RECOMPUTE = {"none", "selective", "full"}
PRECISIONS = {"amp-bf16", "bf16", "amp-fp16", "fp8"}
OFFLOAD = {"none", "optimizer", "params", "activations"}
MEASURED = {
    "iteration_time_s",
    "tokens_per_s_per_gpu",
    "tokens_per_s",
    "tflops_per_gpu",
    "mfu",
    "samples_per_s",
}
HF_MODEL_TYPES = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss"}
MOE_ARCH_KEYS = {"experts", "top_k", "expert_ffn"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _pos_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def validate_runs(doc: dict, model_names: set[str]) -> list[str]:
    """Problems in a published-runs document (FORMAT.md): keys, enums, degree arithmetic, sources.

    Degrees: gpus = dp x tp x pp x cp. Expert parallelism follows Megatron-Core MoE parallel folding
    (Liu et al. 2025, arXiv 2504.14960): the expert layers use ep x expert_tp x expert_dp = tp x dp x cp,
    so ep x expert_tp must divide tp x dp x cp (with expert_tp = tp this is 'ep divides dp x cp').
    """
    errs: list[str] = []
    sources = doc.get("sources")
    if not isinstance(sources, dict) or not sources:
        return ["no sources table"]
    for sid, src in sources.items():
        missing = SOURCE_KEYS - set(src)
        if missing:
            errs.append(f"source {sid}: missing {sorted(missing)}")
        elif not all(isinstance(src[k], str) and src[k] for k in SOURCE_KEYS):
            errs.append(f"source {sid}: empty field")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        return errs + ["no runs"]
    seen: set[str] = set()
    for r in runs:
        rid = r.get("id", "?")
        if set(r) != ROW_KEYS:
            errs.append(
                f"{rid}: keys differ from FORMAT.md: missing {sorted(ROW_KEYS - set(r))}, extra {sorted(set(r) - ROW_KEYS)}"
            )
            continue
        if rid in seen:
            errs.append(f"{rid}: duplicate id")
        seen.add(rid)
        for k in NEVER_NULL:
            if r[k] is None:
                errs.append(f"{rid}: {k} is null")
        if r["source_id"] not in sources:
            errs.append(f"{rid}: source_id {r['source_id']!r} not in sources")
        if r["framework"] not in FRAMEWORKS:
            errs.append(f"{rid}: framework {r['framework']!r}")
        if r["schedule"] not in SCHEDULES:
            errs.append(f"{rid}: schedule {r['schedule']!r}")
        if r["recompute"] not in RECOMPUTE:
            errs.append(f"{rid}: recompute {r['recompute']!r}")
        if r["precision"] not in PRECISIONS:
            errs.append(f"{rid}: precision {r['precision']!r}")
        if r["offload"] not in OFFLOAD:
            errs.append(f"{rid}: offload {r['offload']!r}")
        if r["model"] is None:
            arch = r["arch"] or {}
            if not MOE_ARCH_KEYS <= set(arch.get("moe") or {}):
                errs.append(f"{rid}: model null and arch.moe lacks {sorted(MOE_ARCH_KEYS)}")
        elif r["model"] not in model_names:
            errs.append(f"{rid}: model {r['model']!r} not in validation/models/moe_models.json")
        degrees = [
            r[k]
            for k in (
                "gpus",
                "dp",
                "tp",
                "pp",
                "cp",
                "ep",
                "expert_tp",
                "dp_shard",
                "virtual_stages",
                "global_batch",
                "seq",
            )
        ]
        if not all(_pos_int(x) for x in degrees):
            errs.append(f"{rid}: degrees, batch and seq must be positive integers")
            continue
        if r["dp"] * r["tp"] * r["pp"] * r["cp"] != r["gpus"]:
            errs.append(
                f"{rid}: dp x tp x pp x cp = {r['dp'] * r['tp'] * r['pp'] * r['cp']} != gpus {r['gpus']}"
            )
        if (r["tp"] * r["dp"] * r["cp"]) % (r["ep"] * r["expert_tp"]):
            errs.append(
                f"{rid}: ep x expert_tp = {r['ep'] * r['expert_tp']} does not divide tp x dp x cp"
            )
        if r["zero"] not in (0, 1, 2, 3):
            errs.append(f"{rid}: zero {r['zero']!r}")
        elif r["zero"] == 0 and r["dp_shard"] != 1:
            errs.append(f"{rid}: zero 0 needs dp_shard 1")
        if r["dp"] % r["dp_shard"]:
            errs.append(f"{rid}: dp_shard {r['dp_shard']} does not divide dp {r['dp']}")
        if r["virtual_stages"] > 1 and r["schedule"] != "interleaved-1f1b":
            errs.append(f"{rid}: virtual_stages > 1 needs interleaved-1f1b")
        mb = r["micro_batch"]
        if mb is None:
            if "micro_batch" not in r["inferred"]:
                errs.append(f"{rid}: micro_batch null without a note in inferred")
        elif not _pos_int(mb) or r["global_batch"] % (mb * r["dp"]):
            errs.append(
                f"{rid}: global_batch {r['global_batch']} not a multiple of micro_batch x dp"
            )
        measured = r["measured"]
        if not isinstance(measured, dict) or not MEASURED & set(measured):
            errs.append(f"{rid}: measured has none of {sorted(MEASURED)}")
        elif not all(
            isinstance(measured[k], (int, float)) and measured[k] > 0
            for k in MEASURED & set(measured)
            if measured[k] is not None
        ):
            errs.append(f"{rid}: measured values must be positive numbers")
        if not isinstance(r["inferred"], dict) or not isinstance(r["extras"], dict):
            errs.append(f"{rid}: inferred and extras must be objects")
    for ex in doc.get("excluded", []):
        if set(ex) != {"what", "why"}:
            errs.append(f"excluded entry keys {sorted(ex)}")
    return errs


def validate_hf_config(cfg: dict) -> list[str]:
    """Problems in an HF config fixture: model_type we support and positive core widths."""
    errs = []
    if cfg.get("model_type") not in HF_MODEL_TYPES:
        errs.append(f"model_type {cfg.get('model_type')!r} not in {sorted(HF_MODEL_TYPES)}")
    for k in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "num_experts_per_tok",
    ):
        if not _pos_int(cfg.get(k)):
            errs.append(f"{k} = {cfg.get(k)!r}")
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if not _pos_int(experts):
        errs.append("no expert count")
    elif _pos_int(cfg.get("num_experts_per_tok")) and cfg["num_experts_per_tok"] > experts:
        errs.append("top-k above expert count")
    return errs


def _hf_view(cfg: dict) -> dict:
    """The model-fact fields read back from an HF config, for the cross-check with moe_models.json."""
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    expert_ffn = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    return {
        "layers": cfg["num_hidden_layers"],
        "hidden": cfg["hidden_size"],
        "heads": cfg["num_attention_heads"],
        "kv_heads": cfg["num_key_value_heads"],
        "vocab": cfg["vocab_size"],
        "experts": experts,
        "top_k": cfg["num_experts_per_tok"],
        "expert_ffn": expert_ffn,
    }


def validate_models(doc: dict, hf_dir: Path) -> list[str]:
    errs = []
    sources = doc.get("sources", {})
    for name, m in doc.get("models", {}).items():
        for sid in m.get("source_ids", []) + m["params_published"].get("source_ids", []):
            if sid not in sources:
                errs.append(f"{name}: source {sid} missing")
        path = hf_dir.parent / m["hf_config"]
        if not path.is_file():
            errs.append(f"{name}: fixture {m['hf_config']} missing")
            continue
        view = _hf_view(_load(path))
        facts = {k: m[k] for k in ("layers", "hidden", "heads", "kv_heads", "vocab")}
        facts.update({k: m["moe"][k] for k in ("experts", "top_k", "expert_ffn")})
        for k, v in facts.items():
            if view[k] != v:
                errs.append(f"{name}: {k} {v} in moe_models.json but {view[k]} in {path.name}")
        pub = m["params_published"]["total_params"]
        computed = m["params_check"]["total_params_computed"]
        if abs(computed - pub) / pub > 0.03:
            errs.append(f"{name}: computed total {computed:.4g} vs published {pub:.4g}")
    return errs


def validate_reliability(doc: dict) -> list[str]:
    errs = []
    sources = doc.get("sources", {})
    ids = set()
    for fact in doc.get("facts", []):
        fid = fact.get("id", "?")
        if fid in ids:
            errs.append(f"{fid}: duplicate id")
        ids.add(fid)
        for k in ("value", "unit", "source_id", "where"):
            if fact.get(k) in (None, ""):
                errs.append(f"{fid}: {k} missing")
        if fact.get("source_id") not in sources:
            errs.append(f"{fid}: source {fact.get('source_id')!r} not in sources")
        value = fact.get("value")
        if not isinstance(value, (int, float, str, list)) or isinstance(value, bool):
            errs.append(f"{fid}: value {value!r}")
        if fact.get("derived") and not fact.get("formula"):
            errs.append(f"{fid}: derived without formula")
    for form in doc.get("formulas", []):
        if form.get("source_id") not in sources or not form.get("expression"):
            errs.append(f"formula {form.get('id')}: source or expression missing")
    return errs


@pytest.fixture(scope="module")
def runs_doc():
    return _load(MOE_RUNS)


@pytest.fixture(scope="module")
def models_doc():
    return _load(MOE_MODELS)


def test_moe_runs_follow_the_format(runs_doc, models_doc):
    assert validate_runs(runs_doc, set(models_doc["models"])) == []
    rows = runs_doc["runs"]
    assert len(rows) >= 15
    assert len({r["source_id"] for r in rows}) >= 3


@pytest.mark.parametrize(
    "field, bad",
    [
        ("ep", 3),
        ("dp", 7),
        ("source_id", "nowhere"),
        ("framework", "jax"),
        ("precision", "fp4"),
        ("model", "not-a-model"),
        ("zero", 5),
        ("global_batch", 1001),
        ("measured", {}),
        ("schedule", "dualpipe"),
    ],
)
def test_moe_runs_validator_catches_injected_error(runs_doc, models_doc, field, bad):
    broken = copy.deepcopy(runs_doc)
    row = next(
        r for r in broken["runs"] if r["micro_batch"] is not None and r["virtual_stages"] == 1
    )
    row[field] = bad
    assert validate_runs(broken, set(models_doc["models"])), f"{field}={bad!r} not caught"


def test_moe_runs_validator_catches_missing_key_and_source_field(runs_doc, models_doc):
    broken = copy.deepcopy(runs_doc)
    del broken["runs"][0]["expert_tp"]
    assert any("keys differ" in e for e in validate_runs(broken, set(models_doc["models"])))
    broken = copy.deepcopy(runs_doc)
    del next(iter(broken["sources"].values()))["how_measured"]
    assert validate_runs(broken, set(models_doc["models"]))


def test_expert_parallel_folding_rule(runs_doc, models_doc):
    """ep may exceed dp x cp only through expert_tp < tp (parallel folding); 32 over tp2 x dp16 is legal, 64 is not."""
    broken = copy.deepcopy(runs_doc)
    row = next(r for r in broken["runs"] if r["ep"] > r["dp"] * r["cp"])
    assert row["tp"] > row["expert_tp"]
    row["ep"] = 2 * row["tp"] * row["dp"] * row["cp"]
    assert any("does not divide" in e for e in validate_runs(broken, set(models_doc["models"])))


@pytest.mark.parametrize(
    "path", sorted(HF_DIR.glob("*.json")) + [None], ids=lambda p: p.name if p else "none"
)
def test_hf_config_fixtures(path):
    if path is None:
        names = {p.stem for p in HF_DIR.glob("*.json")}
        assert {
            "mixtral-8x7b",
            "mixtral-8x22b",
            "qwen3-30b-a3b",
            "qwen3-235b-a22b",
            "deepseek-v3",
            "gpt-oss-120b",
        } <= names
        return
    assert validate_hf_config(_load(path)) == []


@pytest.mark.parametrize(
    "key, bad", [("model_type", "llama"), ("num_hidden_layers", 0), ("num_experts_per_tok", 10_000)]
)
def test_hf_config_validator_catches_injected_error(key, bad):
    cfg = _load(HF_DIR / "deepseek-v3.json")
    cfg[key] = bad
    assert validate_hf_config(cfg)


def test_model_facts_agree_with_fixtures_and_published_totals(models_doc):
    assert validate_models(models_doc, HF_DIR) == []
    broken = copy.deepcopy(models_doc)
    broken["models"]["qwen3-30b-a3b"]["moe"]["expert_ffn"] = 1536
    assert validate_models(broken, HF_DIR)


def test_reliability_facts_have_value_unit_source():
    doc = _load(RELIABILITY)
    assert validate_reliability(doc) == []
    assert len(doc["facts"]) >= 20
    broken = copy.deepcopy(doc)
    del broken["facts"][0]["unit"]
    assert validate_reliability(broken)
    broken = copy.deepcopy(doc)
    broken["facts"][1]["source_id"] = "nowhere"
    assert validate_reliability(broken)


def test_llama3_interruption_counts_add_up():
    """Table 5 of Grattafiori et al. 2024: the per-cause counts sum to the 419 unexpected interruptions."""
    facts = {f["id"]: f for f in _load(RELIABILITY)["facts"]}
    causes = [f["value"] for k, f in facts.items() if k.startswith("llama3-cause-")]
    assert sum(causes) == facts["llama3-interruptions-unexpected"]["value"] == 419
    assert (
        facts["llama3-interruptions-planned"]["value"] + 419
        == facts["llama3-interruptions-total"]["value"]
    )
