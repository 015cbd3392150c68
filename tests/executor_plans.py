"""Plan documents for the executor tests and the regret benchmark (inputs, not asserted numbers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from planner.parallel import ParallelConfig

NATIVE_CRASH = re.compile(r"rank \d+ was killed by SIG(?:SEGV|ABRT|BUS)\b")
"""How `planner run` reports a rank that died inside native code. The executor's own code is Python, so such a death
is torch's: its CPU collectives (gloo under functional collectives) have been seen to crash a rank now and then in CI
runs, once with glibc's 'double free or corruption' (SIGABRT in wait_tensor during a pipeline's backward) and once with
SIGSEGV in wait_tensor during a DTensor backward (cp2 x tp2, all_gather; 2026-11-27), while the same layouts pass
dozens of runs in a row. The planner reports it as it should (one line naming the rank, the signal and the logs)."""


def run_planner(args: list[str], **kw):
    """`planner ARGS` through typer's CliRunner, launched once more if a rank died of a native crash
    (NATIVE_CRASH): a crash inside torch is not a verification result. A second crash stands."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, args, **kw)
    if result.exit_code != 0 and NATIVE_CRASH.search(result.output):
        result = CliRunner().invoke(app, args, **kw)
    return result


def plan_document(
    config: ParallelConfig,
    model: str = "planner.executor.tiny:gpt_tiny",
    *,
    hardware: str = "cpu-local",
) -> dict:
    """A schema-valid plan document for `config`; its prediction block is a stand-in marked as such
    (the executor computes its own prediction with planner.estimate when available)."""
    zero_memory = {
        k: 0
        for k in (
            "peak_bytes_per_gpu",
            "capacity_bytes",
            "params_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "activations_bytes",
            "other_bytes",
        )
    }
    return {
        "schema_version": "1",
        "model": {"name": model, "params": 1},
        "hardware": {"name": hardware, "gpus": config.world_size, "nodes": 1},
        "plan": config.to_dict(),
        "prediction": {
            "step_time_s": 1.0,
            "samples_per_s": 0.0,
            "tokens_per_s": 0.0,
            "tflops_per_gpu": 0.0,
            "mfu": 0.0,
            "memory": dict(zero_memory, fits=True),
            "time_breakdown_s": {
                "compute": 0.0,
                "tp_comm": 0.0,
                "dp_comm": 0.0,
                "pp_p2p": 0.0,
                "bubble": 0.0,
            },
            "source": "stand-in written by tests/executor_plans.py (not a prediction)",
        },
    }


def write_plan(
    path: Path, config: ParallelConfig, model: str = "planner.executor.tiny:gpt_tiny"
) -> Path:
    path.write_text(json.dumps(plan_document(config, model)))
    return path


def verified_run(
    tmp_path: Path,
    config: ParallelConfig,
    model: str = "planner.executor.tiny:gpt_tiny",
    steps: int = 3,
):
    """`planner run PLAN --steps N --verify --json` on the plan of `config`: (its document, the CLI result), exit 0
    asserted."""
    plan = write_plan(tmp_path / "plan.json", config, model)
    result = run_planner(
        [
            "run",
            str(plan),
            "--steps",
            str(steps),
            "--verify",
            "--json",
            "--workdir",
            str(tmp_path / "work"),
        ]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result
