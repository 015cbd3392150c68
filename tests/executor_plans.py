"""Plan documents for the executor tests and the regret benchmark (inputs, not asserted numbers)."""

from __future__ import annotations

import json
from pathlib import Path

from planner.parallel import ParallelConfig


def run_planner(args: list[str], **kw):
    """`planner ARGS` through typer's CliRunner, once. A rank that dies of a native signal fails the
    test like any other failure: no relaunch (issue 31; the CPU path that crashed now runs its
    communication in lockstep, parallelize.lockstep_schedule, and
    tests/adversarial/reproduce_native_crash.py soaks it under load)."""
    from typer.testing import CliRunner

    from planner.cli import app

    return CliRunner().invoke(app, args, **kw)


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
