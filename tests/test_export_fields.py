"""The Megatron-LM and torchtitan exports of every export test plan carry the plan file's own
fields: degrees, batch, sequence, model shape, recompute, sharding and precision. Expected values
are read from the plan document (`plan`, `model.arch`) and the targets' documented names, never
from the exporters' helpers; these run in the default tier (the frameworks' own parsers are in the
slow tier: tests/test_export_validate.py)."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from export_plans import VARIANTS, document  # noqa: E402

from planner.errors import ConfigError  # noqa: E402
from planner.exports.megatron import to_megatron  # noqa: E402
from planner.exports.torchtitan import to_torchtitan  # noqa: E402
from planner.plan import plan_from_document  # noqa: E402

TORCH_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "zero-bubble": "InterleavedZeroBubble",
}
"""torch.distributed.pipelining's schedule class names (get_schedule_class) per planner schedule."""


def exported(exporter, variant):
    """(plan fields, model.arch, exported text), or None where the target refuses the plan."""
    doc = document(variant)
    try:
        text = exporter(plan_from_document(doc)).text
    except ConfigError:
        return None
    recipe = (doc.get("software") or {}).get("fp8_scaling")
    return {"cp": 1, "ep": 1, **doc["plan"], "fp8_scaling": recipe}, doc["model"]["arch"], text


def megatron_args(text: str) -> dict[str, str | None]:
    """`--flag value` lines as {flag: value} (None for a bare flag)."""
    lines = [line.split(" ", 1) for line in text.splitlines() if line.startswith("--")]
    return {parts[0]: parts[1] if len(parts) > 1 else None for parts in lines}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_megatron_arguments_carry_the_plan_fields(variant):
    result = exported(to_megatron, variant)
    if result is None:
        pytest.skip("megatron refuses this plan (tests/test_export.py holds the refusals)")
    plan, arch, text = result
    args = megatron_args(text)
    assert args["--tensor-model-parallel-size"] == str(plan["tp"])
    assert args["--pipeline-model-parallel-size"] == str(plan["pp"])
    assert args.get("--context-parallel-size") == (str(plan["cp"]) if plan["cp"] > 1 else None)
    assert args.get("--expert-model-parallel-size") == (str(plan["ep"]) if plan["ep"] > 1 else None)
    assert args["--micro-batch-size"] == str(plan["micro_batch"])
    assert args["--global-batch-size"] == str(plan["global_batch"])
    assert args["--seq-length"] == str(plan["seq"])
    for flag, field in (
        ("--num-layers", "layers"),
        ("--hidden-size", "hidden"),
        ("--num-attention-heads", "heads"),
        ("--vocab-size", "vocab"),
    ):
        assert args[flag] == str(arch[field]), flag
    moe = arch.get("moe") or {}
    assert args.get("--num-experts") == (str(moe["experts"]) if moe.get("experts") else None)
    recompute = plan["recompute"]
    assert args.get("--recompute-granularity") == (None if recompute == "none" else recompute)
    assert ("--use-megatron-fsdp" in args) == (plan["zero"] >= 2)
    if plan["zero"] >= 2:
        strategy = "optim_grads" if plan["zero"] == 2 else "optim_grads_params"
        assert args["--data-parallel-sharding-strategy"] == strategy
    assert ("--fp16" in args) == (plan["precision"] == "amp-fp16")
    fp4 = plan["precision"] == "fp8" and plan["fp8_scaling"] == "nvfp4"  # FP4 arguments instead
    assert ("--fp8-format" in args) == (plan["precision"] == "fp8" and not fp4)
    assert (args.get("--fp4-format"), args.get("--fp4-recipe")) == (
        ("e2m1", "nvfp4") if fp4 else (None, None)
    )


def torchtitan_fields(text: str) -> dict[str, str]:
    """`name=value,` lines of the job's config constructors."""
    return dict(re.findall(r"^\s+(\w+)=(.+?),?$", text, flags=re.M))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_torchtitan_job_carries_the_plan_fields(variant):
    result = exported(to_torchtitan, variant)
    if result is None:
        pytest.skip("torchtitan refuses this plan (tests/test_export.py holds the refusals)")
    plan, _, text = result
    job = torchtitan_fields(text)
    assert job["tensor_parallel_degree"] == str(plan["tp"])
    assert job["pipeline_parallel_degree"] == str(plan["pp"])
    assert job["context_parallel_degree"] == str(plan["cp"])
    replicas, shards = (
        int(job["data_parallel_replicate_degree"]),
        int(job["data_parallel_shard_degree"]),
    )
    assert replicas * shards == plan["dp"]
    assert job["global_batch_size"] == str(plan["global_batch"])
    assert job["seq_len"] == str(plan["seq"])
    if plan["pp"] > 1:
        assert job["pipeline_parallel_schedule"] == repr(TORCH_SCHEDULES[plan["schedule"]])
        assert job["pipeline_parallel_microbatch_size"] == str(plan["micro_batch"])
    recompute = {"none": "None", "full": "FullAC", "selective": "SelectiveAC"}[plan["recompute"]]
    if plan.get("recompute_layers") is not None:
        recompute = f"FirstBlocksAC.Config(blocks={plan['recompute_layers']})"
    assert re.search(r"config\.activation_checkpoint = (.+)", text)[1].startswith(recompute)


def test_most_export_plans_reach_both_exporters():
    """The two tests above skip refused plans: most plans must still be exported by each target."""
    for exporter in (to_megatron, to_torchtitan):
        done = [v for v in VARIANTS if exported(exporter, v) is not None]
        assert len(done) >= len(VARIANTS) // 2, (exporter.__name__, len(done))
