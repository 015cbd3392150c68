"""The export matrix: scenarios (pp = 1 with accumulation, a pipeline, fp8, context parallelism, a
MoE model
with expert parallelism) x the four frameworks. Each plan is made for its framework by `estimate`;
each cell is
either refused in one line (by `estimate` or `export`, exit 2 on the command line) or exported,
parsed by the
framework's own code (tests/validators/) and compared field by field with the plan document itself:
degrees,
micro and global batch, accumulation, sequence, recompute, sharding, precision, model shape and
parameter count.
The expected values are read from the document (`plan`, `model`, `model.arch`), never from the
planner's helpers.

`pytest -s tests/test_export_matrix.py` prints the matrix with every cell's result."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from validators import env  # noqa: E402

from planner.errors import ConfigError  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.exports import export_plan  # noqa: E402
from planner.parallel import FRAMEWORKS, ParallelConfig  # noqa: E402
from planner.plan import plan_from_document  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.network]


DENSE = ("llama3-8b", "p5.48xlarge", 16)
MOE = ("qwen3-30b-a3b", "p5.48xlarge", 16)

SCENARIOS = {
    # name: (model, hardware, gpus, plan fields, per-framework changes)
    "pp1 accumulation": (
        *DENSE,
        dict(
            dp=8,
            tp=2,
            micro_batch=1,
            global_batch=64,
            zero=1,
            recompute="selective",
            sequence_parallel=True,
            seq=8192,
            placement="PDT",
        ),
        {"fsdp": dict(dp=16, tp=1, sequence_parallel=False, recompute="full", zero=3)},
    ),
    "pp4 1f1b": (
        *DENSE,
        dict(
            dp=2,
            tp=2,
            pp=4,
            micro_batch=1,
            global_batch=32,
            zero=1,
            recompute="full",
            sequence_parallel=True,
            seq=8192,
            schedule="1f1b",
            placement="PDT",
        ),
        {},
    ),
    "fp8 zero3": (
        *DENSE,
        dict(
            dp=16,
            micro_batch=1,
            global_batch=64,
            zero=3,
            recompute="full",
            precision="fp8",
            seq=8192,
            placement="PDT",
        ),
        {},
    ),
    "cp4": (
        *DENSE,
        dict(
            dp=2,
            tp=2,
            cp=4,
            micro_batch=1,
            global_batch=16,
            zero=1,
            recompute="full",
            sequence_parallel=True,
            seq=32768,
            cp_comm="p2p",
            placement="PDCT",
        ),
        {"deepspeed": dict(cp_comm="a2a", sequence_parallel=False)},
    ),
    "moe ep8": (
        *MOE,
        dict(
            dp=8,
            tp=2,
            ep=8,
            micro_batch=1,
            global_batch=64,
            zero=1,
            recompute="full",
            sequence_parallel=True,
            seq=4096,
            placement="PDET",
        ),
        {"torchtitan": dict(placement="PDECT")},
    ),
}

PRECISION_FLAGS = {
    "fp32": (False, False),
    "amp-fp16": (False, True),
    "amp-bf16": (True, False),
    "bf16": (True, False),
    "fp8": (True, False),
}
"""Plan precision -> (bf16, fp16) of the 16-bit compute type (fp8 runs on bf16 outside its
GEMMs)."""


def plan_document(scenario: str, framework: str) -> dict:
    """The `planner estimate --json` document of the scenario's plan made for `framework`."""
    model, hardware, gpus, fields, changes = SCENARIOS[scenario]
    fields = {**fields, **changes.get(framework, {})}
    if fields.get("zero") == 1 and framework in (
        "torchtitan",
        "fsdp",
    ):  # no optimizer-only sharding there
        fields["zero"] = 2
    cfg = ParallelConfig(framework=framework, **fields)
    return estimate(model, hardware, cfg, gpus=gpus).to_document()


def world(p: dict) -> int:
    return p["dp"] * p["tp"] * p["pp"] * p.get("cp", 1)


def check_megatron(doc, args, text):
    p, arch = doc["plan"], doc["model"]["arch"]
    assert (
        args["data_parallel_size"],
        args["tensor_model_parallel_size"],
        args["pipeline_model_parallel_size"],
        args["context_parallel_size"],
        args["expert_model_parallel_size"],
    ) == (p["dp"], p["tp"], p["pp"], p["cp"], p["ep"])
    assert (args["micro_batch_size"], args["global_batch_size"]) == (
        p["micro_batch"],
        p["global_batch"],
    )
    assert (
        args["global_batch_size"] // (args["micro_batch_size"] * args["data_parallel_size"])
        == p["num_microbatches"]
    )
    assert args["seq_length"] == p["seq"]
    assert args["recompute_granularity"] == (None if p["recompute"] == "none" else p["recompute"])
    assert args["use_distributed_optimizer"] == (p["zero"] >= 1) and args["use_megatron_fsdp"] == (
        p["zero"] >= 2
    )
    assert (args["bf16"], args["fp16"]) == PRECISION_FLAGS[p["precision"]]
    assert (args["fp8"] is not None) == (p["precision"] == "fp8")
    assert (args["num_layers"], args["hidden_size"], args["num_attention_heads"]) == (
        arch["layers"],
        arch["hidden"],
        arch["heads"],
    )
    assert (
        args["num_query_groups"]
        == (arch["kv_heads"] if arch["kv_heads"] != arch["heads"] else None)
        or not args["group_query_attention"]
    )
    if arch.get("moe"):
        assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"]) == (
            arch["moe"]["experts"],
            arch["moe"]["top_k"],
            arch["moe"]["expert_ffn"],
        )
    else:
        assert args["ffn_hidden_size"] == arch["ffn"] and not args["num_experts"]
    return "params n/a (arguments only)"


def check_torchtitan(doc, c, text):
    p, arch = doc["plan"], doc["model"]["arch"]
    dims, b, tr = c["dims"], c["batch"], c["training"]
    assert dims["dp_replicate"] * dims["dp_shard"] == p["dp"]
    assert (dims["tp"], dims["pp"], dims["cp"], dims["ep"]) == (p["tp"], p["pp"], p["cp"], p["ep"])
    if (
        p["ep"] == 1
    ):  # the plan's shard group (ZeRO-0: none); with ep, torchtitan may widen it (a header note)
        assert dims["dp_shard"] == (1 if p["zero"] == 0 else p["dp_shard"] or p["dp"])
    assert (b["global_batch"], b["sequences_per_forward"]) == (p["global_batch"], p["micro_batch"])
    assert b["accumulation_steps"] * b["pp_microbatches"] == p["num_microbatches"]
    assert tr["seq_len"] == p["seq"]
    assert (
        c["activation_checkpoint"]
        == {"none": None, "full": "FullAC", "selective": "SelectiveAC"}[p["recompute"]]
    )
    assert c["parallelism"]["fsdp_reshard_after_forward"] == (
        "always" if p["zero"] == 3 else "default" if dims["dp_shard"] == 1 else "never"
    )
    assert ("Float8Linear" in c["model"]["linear_types"]) == (p["precision"] == "fp8")
    assert tr["mixed_precision_param"] == ("float32" if p["precision"] == "fp32" else "bfloat16")
    m = c["model"]
    assert (m["layers"], m["dim"], m["n_heads"], m["vocab"]) == (
        arch["layers"],
        arch["hidden"],
        arch["heads"],
        arch["vocab"],
    )
    assert m["params"] == doc["model"]["params"]
    return f"params {m['params']:,}"


def check_fsdp(doc, c, text):
    p, arch = doc["plan"], doc["model"]["arch"]
    assert c["num_processes"] == world(p) and p["tp"] == p["pp"] == p["cp"] == p["ep"] == 1
    assert c["per_device_train_batch_size"] == p["micro_batch"]
    assert c["gradient_accumulation_steps"] == p["num_microbatches"]
    assert (
        c["per_device_train_batch_size"] * c["num_processes"] * c["gradient_accumulation_steps"]
        == p["global_batch"]
    )
    sharded = p["zero"] >= 1
    assert c["distributed_type"].endswith("FSDP" if sharded else "MULTI_GPU")
    if sharded:
        assert c["reshard_after_forward"] == (p["zero"] == 3)
        assert c["activation_checkpointing"] == (p["recompute"] == "full")
    mixed = {"fp32": "no", "amp-fp16": "fp16", "amp-bf16": "bf16", "bf16": "bf16", "fp8": "fp8"}[
        p["precision"]
    ]
    assert c["mixed_precision"] == c["trainer_mixed_precision"] == mixed
    assert c["fp8_backend"] == ("TE" if p["precision"] == "fp8" else None)
    assert (c["layers"], c["hidden"], c["heads"], c["vocab"]) == (
        arch["layers"],
        arch["hidden"],
        arch["heads"],
        arch["vocab"],
    )
    assert c["params"] == doc["model"]["params"]
    return f"params {c['params']:,}"


def check_deepspeed(doc, c, text):
    p = doc["plan"]
    assert (c["train_batch_size"], c["micro_batch"]) == (p["global_batch"], p["micro_batch"])
    assert c["gradient_accumulation_steps"] == p["num_microbatches"]
    assert c["zero_stage"] == p["zero"]
    assert (c["bf16"], c["fp16"]) == PRECISION_FLAGS[p["precision"]]
    assert c["checkpointing_configured"] == (p["recompute"] != "none")
    if (
        p["pp"] > 1
    ):  # DeepSpeed's own PipelineModule._partition_layers on the exported partition_method
        assert c["pipeline"]["stages"] == p["pp"] and c["partition"] == p["stages"]
    assert json.loads(text).get("sequence_parallel_size", 1) == p["cp"]
    return "model shape n/a (model code)"


CHECKS = {
    "megatron": ("args", check_megatron),
    "torchtitan": ("config", check_torchtitan),
    "fsdp": ("config", check_fsdp),
    "deepspeed": ("config", check_deepspeed),
}


def cell(scenario: str, framework: str):
    """('refused', line) or ('exported', plan document, export)."""
    try:
        doc = plan_document(scenario, framework)
        return "exported", doc, export_plan(plan_from_document(doc), framework)
    except ConfigError as err:
        assert "\n" not in str(err), str(err)
        return "refused", str(err)


def validate_column(framework: str) -> dict[str, str]:
    """Every scenario's cell for `framework`: the refusal, or the fields checked after the
    framework's parser."""
    cells = {name: cell(name, framework) for name in SCENARIOS}
    exported = [(name, c[1], c[2]) for name, c in cells.items() if c[0] == "exported"]
    items = [
        {
            "text": exp.text,
            "world_size": world(doc["plan"]),
            "dp": doc["plan"]["dp"],
            "tp": doc["plan"]["tp"],
            "pp": doc["plan"]["pp"],
            "blocks": doc["model"]["arch"]["layers"],
        }
        for _, doc, exp in exported
    ]
    results = env.validate(framework, items) if items else []
    key, check = CHECKS[framework]
    out = {name: "refused: " + c[1] for name, c in cells.items() if c[0] == "refused"}
    for (name, doc, exp), result in zip(exported, results):
        assert result["ok"], f"{framework} rejected {name}: {result['error']}"
        out[name] = "parsed, equal to the plan (" + check(doc, result[key], exp.text) + ")"
    return out


MATRIX: dict[str, dict[str, str]] = {}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_cell_is_refused_in_one_line_or_equal_to_the_plan(framework):
    MATRIX[framework] = column = validate_column(framework)
    print(f"\n{framework}:")
    for name in SCENARIOS:
        print(f"  {name:18} {column[name]}")
    assert sum(v.startswith("parsed") for v in column.values()) >= 2


def test_the_matrix_covers_the_issue_cells():
    """pp = 1, fp8, cp > 1 and MoE with ep export somewhere, and fp8 exports to fsdp (Accelerate's
    TE backend)."""
    if len(MATRIX) < len(FRAMEWORKS):
        pytest.skip("run with the framework columns")
    for scenario in SCENARIOS:
        assert any(MATRIX[f][scenario].startswith("parsed") for f in FRAMEWORKS), scenario
    assert MATRIX["fsdp"]["fp8 zero3"].startswith("parsed")
