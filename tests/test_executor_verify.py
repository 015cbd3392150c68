"""`planner run --verify` has power both ways.

It passes a GPT-2 over 3 AdamW steps (the optimizer's moments carried across two updates; a further
step runs the same code again) on every layout the executor runs, grouped into three launches. The
default run uses the small gpt_tiny (a launch takes seconds); the slow tier (`pytest --slow`) runs
the catalog gpt2 (124M parameters, real size, seq 32; a launch costs 1-2 minutes here):
- dp2: DDP, ZeRO-0;
- dp2 x pp2: 1F1B with ZeRO-1 (FSDP2 per stage; ZeRO-2 is the same code, parallelize.apply_fsdp);
- dp2 x tp2 x pp2 (8 processes): ZeRO-3 over tensor-parallel shards (FSDP2's strided shards),
  interleaved 1F1B (v=2), sequence parallelism, full recomputation; it holds tp2 + SP, pp2
  interleaved and dp2 x tp2.
ZeRO-0 with pipelining or tensor parallelism (the explicit gradient all-reduce) runs on the small
models of test_executor_parallel.py. Each check's largest error/bound ratio is asserted well below 1.

It fails each planted parallelization bug (faults.BUGS, the hidden --inject-fault bug:NAME) at
step 0, naming what diverged first; on the small gpt_tiny model (the bound is derived per model, so
the same arithmetic applies, and a launch takes seconds instead of a minute).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from executor_plans import run_planner, write_plan
from planner.cli import app
from planner.executor.tiny import gpt_tiny
from planner.parallel import ParallelConfig

runner = CliRunner()

GPT2_LAYOUTS = {
    "dp2-ddp": dict(dp=2, global_batch=2, micro_batch=1),
    "dp2xpp2-1f1b-zero1": dict(dp=2, pp=2, zero=1, schedule="1f1b", global_batch=4, micro_batch=1),
    "dp2xtp2xpp2-zero3-interleaved-sp-full": dict(
        dp=2,
        tp=2,
        pp=2,
        zero=3,
        schedule="interleaved-1f1b",
        virtual_stages=2,
        sequence_parallel=True,
        recompute="full",
        global_batch=4,
        micro_batch=1,
        placement="DPT",
    ),
}


TINY = "planner.executor.tiny:gpt_tiny"
GPT2_MODELS = {
    # model argument: (its parameter tensors, blocks, width) from the model's own definition
    TINY: (len(list(gpt_tiny().parameters())), 4, 32),
    "gpt2": (148, 12, 768),  # Hugging Face gpt2: 12 blocks of 12 tensors, 2 embeddings, final norm
}


EIGHT_RANKS = "dp2xtp2xpp2-zero3-interleaved-sp-full"
"""Slow even on gpt_tiny (8 processes on 2 cores); the default tier runs the same 8-rank layout
against one process on llama_tiny (test_executor_parallel.py)."""
VERIFIED = [
    *(
        pytest.param(
            TINY, name, id=f"gpt_tiny-{name}", marks=[pytest.mark.slow] * (name == EIGHT_RANKS)
        )
        for name in GPT2_LAYOUTS
    ),
    *(
        pytest.param("gpt2", name, id=f"gpt2-{name}", marks=pytest.mark.slow)
        for name in GPT2_LAYOUTS
    ),
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("model,name", VERIFIED)
def test_gpt2_passes_verification_over_three_adamw_steps(model, name, tmp_path):
    cfg = ParallelConfig(seq=32, precision="fp32", **GPT2_LAYOUTS[name])
    plan = write_plan(tmp_path / "plan.json", cfg, model)
    tensors, layers, hidden = GPT2_MODELS[model]
    result = run_planner(["run", str(plan), "--steps", "3", "--verify", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    verify = doc["verify"]
    assert verify["passed"] and verify["steps"] == [0, 1, 2], verify
    assert verify["problems"] == [] and verify["params_compared"] >= tensors  # none missing
    ratios = verify["max_ratio"]
    assert set(ratios) == {"initial parameters", "loss", "gradient", "parameters"}
    # margins: a correct run sits orders of magnitude under its rounding bound
    assert ratios["loss"] < 0.05 and ratios["gradient"] < 0.05, ratios
    assert ratios["initial parameters"] == 0 and ratios["parameters"] < 1e-3, ratios
    assert doc["model"]["ran"]["layers"] == layers and doc["model"]["ran"]["hidden"] == hidden
    assert len(doc["ranks"]) == cfg.world_size and doc["workdir"] is None


BUG_PLANS = {
    "skip_dp_reduce": (dict(dp=2, global_batch=4, micro_batch=1), ("gradient",)),
    "tp_no_reduce": (dict(tp=2, global_batch=4, micro_batch=2), ("loss", "gradient")),
    "tp_double_reduce": (
        dict(tp=2, sequence_parallel=True, global_batch=4, micro_batch=2),
        ("loss", "gradient"),
    ),
    "drop_microbatch": (dict(pp=2, schedule="1f1b", global_batch=4, micro_batch=1), ("gradient",)),
    "double_microbatch": (dict(pp=2, schedule="1f1b", global_batch=4, micro_batch=1), ("loss",)),
    "zero_shard_offset": (dict(dp=2, zero=2, global_batch=4, micro_batch=1), ("parameters",)),
    "cp_drop_kv_block": (dict(cp=2, global_batch=2, placement="DPCT"), ("loss", "gradient")),
    "ep_wrong_rank": (
        dict(dp=2, ep=2, global_batch=4, micro_batch=1, placement="DPET"),
        ("loss", "gradient"),
    ),
    "hsdp_skip_replica_reduce": (dict(dp=2, dp_shard=1, zero=3, global_batch=2), ("gradient",)),
}
BUG_MODELS = {"ep_wrong_rank": "planner.executor.tiny:mixtral_tiny"}
"""Models other than gpt_tiny (expert parallelism needs experts)."""


SLOW_BUGS = {"tp_double_reduce", "zero_shard_offset"}
"""2-4 s each: the slow tier; the other seven planted bugs (one of each parallelism) run in the
default tier."""


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "bug", [pytest.param(b, marks=[pytest.mark.slow] if b in SLOW_BUGS else []) for b in BUG_PLANS]
)
def test_each_planted_bug_fails_verification_naming_what_diverged(bug, tmp_path):
    knobs, kinds = BUG_PLANS[bug]
    plan = write_plan(
        tmp_path / "plan.json",
        ParallelConfig(seq=32, precision="fp32", **knobs),
        BUG_MODELS.get(bug, TINY),
    )
    result = runner.invoke(
        app,
        ["run", str(plan), "--steps", "2", "--verify", "--json", "--inject-fault", f"bug:{bug}"],
    )
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: verification failed: "), result.stderr
    first = json.loads(result.stdout)["verify"]["first_failure"]
    assert first["step"] == 0 and first["kind"] in kinds and first["ratio"] > 1, first
    what = {
        "loss": "the loss at step 0",
        "gradient": f"the gradient of {first['tensor']} at step 0",
        "parameters": f"parameter {first['tensor']} after step 0",
    }[first["kind"]]
    assert what in lines[0] and "x its rounding bound" in lines[0]
    # whatever diverged first, the evidence is far above the bound somewhere
    assert (
        max(r for r in json.loads(result.stdout)["verify"]["max_ratio"].values() if r is not None)
        > 100
    )
