"""Layouts the gpt2 acceptance runs (test_executor_verify.py) do not cover, launched once each
through `planner run --verify` on small models: the Llama shape (rotary positions, grouped-query
attention, SwiGLU, RMSNorm) under dp x tp and the 3D mesh, GPipe with selective recomputation, the
interleaved zero-bubble schedule, a --proxy run of GPT-3 175B, the torchrun entry point. AdamW
everywhere: verification judges each step against its rounding bound (verify.py), so AdamW's
normalized update no longer needs SGD to pass.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from executor_plans import verified_run, write_plan
from planner.cli import app
from planner.parallel import ParallelConfig

runner = CliRunner()
GPT = "planner.executor.tiny:gpt_tiny"
LLAMA = "planner.executor.tiny:llama_tiny"

LAYOUTS = {
    "llama-dp2xtp2": (LLAMA, dict(dp=2, tp=2, global_batch=4, micro_batch=1)),
    "llama-dp2xtp2xpp2-zero3-full-sp": (
        LLAMA,
        dict(
            dp=2,
            tp=2,
            pp=2,
            zero=3,
            recompute="full",
            sequence_parallel=True,
            schedule="1f1b",
            global_batch=8,
            micro_batch=2,
            placement="DPT",
        ),
    ),
    "dp2xpp2-gpipe-selective": (
        GPT,
        dict(
            dp=2,
            pp=2,
            zero=0,
            schedule="gpipe",
            recompute="selective",
            global_batch=8,
            micro_batch=2,
        ),
    ),
    # full recomputation of the first block of each stage only (recompute_layers, Megatron's 'block' method)
    "llama-dp2xpp2-recompute-first-layer": (
        LLAMA,
        dict(
            dp=2,
            pp=2,
            zero=1,
            recompute="full",
            recompute_layers=1,
            schedule="1f1b",
            global_batch=4,
            micro_batch=1,
        ),
    ),
    "pp2-zero-bubble-sgd": (
        GPT,
        dict(pp=2, schedule="zero-bubble", global_batch=4, micro_batch=1, optimizer="sgd"),
    ),
}


SLOW_LAYOUTS = {"llama-dp2xtp2"}
"""~15-20 s on two cores: the slow tier. The 3D Llama layout (dp x tp x pp, ZeRO-3, full
recomputation, sequence parallelism) runs its dp x tp part in the default tier."""


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_LAYOUTS else []) for n in LAYOUTS],
)
def test_layout_equals_single_process_reference(name, tmp_path):
    model, knobs = LAYOUTS[name]
    cfg = ParallelConfig(seq=32, precision="fp32", **knobs)
    doc, result = verified_run(tmp_path, cfg, model)
    verify = doc["verify"]
    assert verify["passed"] and verify["steps"] == [0, 1, 2], verify
    assert max(verify["max_ratio"].values()) < 0.05, verify["max_ratio"]
    assert (
        verify["problems"] == [] and verify["params_compared"] > 0
    )  # no parameter missing or extra
    assert len(doc["ranks"]) == cfg.world_size
    # measured beside predicted: the cost model's step time for the same plan on the cpu-local profile
    assert doc["prediction"]["profile"] == "cpu-local" and doc["prediction"]["step_time_s"] > 0
    assert all(len(r["step_times_s"]) == 3 and min(r["step_times_s"]) > 0 for r in doc["ranks"])
    # every rank sits where the placement string puts it: tp innermost for "DPT"
    for r in doc["ranks"]:
        assert r["rank"] == (r["dp"] * cfg.pp + r["pp"]) * cfg.tp + r["tp"]


@pytest.mark.multiprocess
@pytest.mark.slow  # a GPT-3 175B-shaped proxy, ~7 s; the layouts above run the same launcher
def test_proxy_runs_a_model_too_large_for_this_machine_with_the_same_layout(tmp_path):
    cfg = ParallelConfig(
        tp=2,
        pp=2,
        schedule="1f1b",
        sequence_parallel=True,
        global_batch=4,
        micro_batch=1,
        seq=2048,
        precision="amp-bf16",
        stages=(40, 56),
    )
    plan = write_plan(tmp_path / "plan.json", cfg, "gpt3-175b")
    without = runner.invoke(app, ["run", str(plan)])
    assert without.exit_code == 2 and "--proxy" in without.output
    result = runner.invoke(
        app,
        [
            "run",
            str(plan),
            "--proxy",
            "--steps",
            "2",
            "--verify",
            "--json",
            "--workdir",
            str(tmp_path / "work"),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verify"]["passed"], doc["verify"]
    assert (doc["plan"]["tp"], doc["plan"]["pp"], doc["plan"]["schedule"]) == (2, 2, "1f1b")
    assert doc["plan"]["stages"] == [1, 1] and doc["plan"]["num_microbatches"] == 4
    notes = " ".join(doc["notes"])
    assert "--proxy: gpt3-175b is too large" in notes and "downgraded to fp32" in notes


@pytest.mark.slow
@pytest.mark.multiprocess
def test_same_entry_point_under_torchrun(tmp_path):
    """`torchrun -m planner run` (the cluster path, here with gloo): every rank trains, rank 0 prints."""
    import os
    import subprocess
    import sys

    cfg = ParallelConfig(
        pp=2, schedule="1f1b", global_batch=4, micro_batch=1, seq=32, precision="fp32"
    )
    plan = write_plan(tmp_path / "plan.json", cfg)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "planner",
            "run",
            str(plan),
            "--steps",
            "2",
            "--verify",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["verify"]["passed"] and doc["workdir"] == "torchrun"
    assert [r["stages"] for r in doc["ranks"]] == [[0], [1]]


@pytest.mark.multiprocess
def test_human_output_puts_measured_and_predicted_step_times_side_by_side(tmp_path):
    cfg = ParallelConfig(dp=2, global_batch=2, micro_batch=1, seq=32, precision="amp-bf16")
    plan = write_plan(tmp_path / "plan.json", cfg)
    result = runner.invoke(
        app, ["run", str(plan), "--steps", "2", "--workdir", str(tmp_path / "work")]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "measured s/step" in lines[1] and "predicted s/step" in lines[1]
    assert (
        len([line for line in lines[2:4] if len(line.split()) == 7]) == 2
    )  # one row per rank, both columns
    assert any("predicted" in line and "cpu-local" in line for line in lines)
    assert any(line.startswith("note: precision amp-bf16 downgraded to fp32") for line in lines)
