"""`planner run PLAN.json`: execute a plan on the embedded executor (planner.executor) and report
per-rank measured step times beside the cost model's prediction for the same plan on `cpu-local`.

Locally it spawns world-size processes (gloo on CPU by default); under torchrun (RANK/WORLD_SIZE in
the environment) every rank runs this same command and rank 0 prints (docs/executor.md).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.commands.common import JsonOpt, PlanArg, emit_json


def run(
    plan: PlanArg,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps to run.")] = 3,
    backend: Annotated[str, typer.Option("--backend", help="gloo (CPU processes) or nccl (one GPU per rank).")] = "gloo",
    verify: Annotated[bool, typer.Option("--verify", help="Compare loss and every parameter with a single-process reference.")] = False,
    proxy: Annotated[bool, typer.Option("--proxy", help="If the model is too large here, run a shrunk model with the same parallel layout.")] = False,
    checkpoint_dir: Annotated[Optional[Path], typer.Option("--checkpoint-dir", help="Save every step with torch.distributed.checkpoint; resume from the latest.")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the weights and the synthetic data.")] = 0,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=1.0, help="Process-group timeout: a hung rank fails the run after this long.")] = 60.0,
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help="Where rank logs and heartbeats go (default: a temporary directory).")] = None,
    hardware: Annotated[Optional[str], typer.Option("--hardware", help="Profile of the prediction column (default: cpu-local for gloo, the plan's hardware for nccl).")] = None,
    json_out: JsonOpt = False,
    inject_fault: Annotated[Optional[str], typer.Option("--inject-fault", hidden=True, help="Tests: kill:RANK:STEP or hang:RANK:STEP.")] = None,
) -> None:
    """Run PLAN.json for real: per-rank step times beside the prediction, optionally verified."""
    from planner.errors import ConfigError
    from planner.executor import ExecutorError
    from planner.executor.runspec import build_run_spec

    if fault_is_bad(inject_fault):
        raise ConfigError("inject-fault", inject_fault, "kill:RANK:STEP or hang:RANK:STEP")
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or {"RANK", "WORLD_SIZE", "MASTER_ADDR"} <= set(os.environ)
    world_env = int(os.environ["WORLD_SIZE"]) if under_torchrun else None
    spec = build_run_spec(plan, steps=steps, backend=backend, proxy=proxy, seed=seed, timeout_s=timeout_s,
                          checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None, fault=inject_fault,
                          world_size_available=world_env)
    if under_torchrun:
        ranks, wall_s, where = _run_torchrun(spec)
        if ranks is None:
            return
    else:
        from planner.executor.launch import launch_local

        launched = launch_local(spec, workdir=workdir)
        ranks, wall_s, where = launched.ranks, launched.wall_s, launched.workdir
    verification = None
    if verify:
        from planner.executor.verify import verify_run

        verification = verify_run(spec, ranks)
    if hardware is None:
        from planner.plan import load_plan

        hardware = "cpu-local" if spec.backend == "gloo" else load_plan(plan).hardware_name
    prediction, prediction_note = predict_step_time_s(spec, hardware)
    document = run_document(spec, ranks, wall_s=wall_s, workdir=where, verification=verification,
                            prediction_s=prediction, prediction_note=prediction_note, profile=hardware)
    if json_out:
        emit_json(document)
    else:
        typer.echo(render(document))
    if verification is not None and not verification.passed:
        raise ExecutorError(f"verification failed: loss rel err {verification.loss_max_rel_err:.2e}, "
                            f"worst parameter {verification.worst_param} rel err "
                            f"{verification.param_max_rel_err:.2e} (tolerance {verification.rtol:g})"
                            + ("; " + "; ".join(verification.problems) if verification.problems else "")
                            + ("; " + verification.hint() if verification.hint() else ""))


def fault_is_bad(fault: str | None) -> bool:
    if fault is None:
        return False
    parts = fault.split(":")
    return len(parts) != 3 or parts[0] not in ("kill", "hang") or not all(p.isdigit() for p in parts[1:])


def _run_torchrun(spec):
    """Every rank trains; rank 0 returns the gathered results (others return None)."""
    import time

    import torch.distributed as dist

    from planner.executor.worker import train

    t0 = time.perf_counter()
    rank = int(os.environ["RANK"])
    ranks = train(spec, rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                  local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    dist.barrier()
    dist.destroy_process_group()
    return ranks, time.perf_counter() - t0, "torchrun"


def predict_step_time_s(spec, profile: str = "cpu-local") -> tuple[float | None, str | None]:
    """The cost model's step time for what actually ran (the run's model and precision) on
    `profile`; None with a note when the estimator or the profile is not in this build."""
    try:
        from hardware_profiles import load_profile
        from planner.estimate import estimate
    except ImportError as err:
        return None, f"prediction column left out: {err.name} is not in this build yet"
    from planner.errors import PlannerError

    try:
        hw = load_profile(profile)
    except PlannerError as err:
        return None, f"prediction column left out: hardware profile {profile!r} unavailable ({err})"
    # what ran is the embedded executor, a torchtitan-style stack (frameworks/torchtitan.json)
    config = dataclasses.replace(spec.config, precision=spec.dtype, offload=spec.offload, framework="torchtitan")
    result = estimate(spec.model, hw, config, gpus=config.world_size, check_framework=False)
    return float(result.step_time_s), None


def run_document(spec, ranks, *, wall_s, workdir, verification, prediction_s, prediction_note,
                 profile: str = "cpu-local") -> dict:
    """The one object both the table and --json print."""
    rows = []
    for r in sorted(ranks, key=lambda r: r["rank"]):
        times = r["step_times_s"]
        steady = times[1:] if len(times) > 1 else times
        rows.append({"rank": r["rank"], **r["coords"], "stages": r["stages"], "step_times_s": times,
                     "mean_step_time_s": statistics.fmean(steady) if steady else None})
    means = [row["mean_step_time_s"] for row in rows if row["mean_step_time_s"] is not None]
    warmup_excluded = max((len(r["step_times_s"]) for r in ranks), default=0) > 1
    how = ("slowest rank's mean over steps after the first (warm-up excluded)" if warmup_excluded else
           "slowest rank's only step (includes warm-up: run 2 or more steps to exclude it)")
    notes = list(spec.notes)
    if prediction_note:
        notes.append(prediction_note)
    start = ranks[0]["start_step"]
    if start:
        notes.append(f"resumed from {spec.checkpoint_dir} after step {start - 1}; steps {start}..{spec.steps - 1} ran now")
    return {
        "schema_version": "1",
        "model": {"name": spec.model_name, "ran": dataclasses.asdict(spec.model)},
        "plan": spec.config.to_dict(),
        "backend": spec.backend, "precision_used": spec.dtype, "world_size": spec.config.world_size,
        "steps": spec.steps, "seed": spec.seed,
        "losses": ranks[0]["losses"],
        "ranks": rows,
        "measured": {"step_time_s": max(means) if means else None,
                     "warmup_excluded": warmup_excluded, "note": how},
        "prediction": ({"step_time_s": prediction_s, "profile": profile} if prediction_s is not None else None),
        "verify": verification.to_dict() if verification is not None else None,
        "launch_wall_s": wall_s, "workdir": workdir, "notes": notes,
    }


def render(doc: dict) -> str:
    cfg = doc["plan"]
    lines = [f"ran {doc['model']['name']} on {doc['world_size']} {doc['backend']} ranks: dp={cfg['dp']} tp={cfg['tp']} "
             f"pp={cfg['pp']} schedule={cfg['schedule']} v={cfg['virtual_stages']} zero={cfg['zero']} "
             f"recompute={cfg['recompute']} sp={cfg['sequence_parallel']} placement={cfg['placement']} "
             f"precision={doc['precision_used']}, {doc['steps']} steps"]
    pred = doc["prediction"]
    header = f"{'rank':>4} {'dp':>3} {'pp':>3} {'tp':>3} {'stages':>8} {'measured s/step':>16}"
    if pred:
        header += f" {'predicted s/step':>17}"
    lines.append(header)
    for row in doc["ranks"]:
        stages = ",".join(map(str, row["stages"]))
        mean = row["mean_step_time_s"]
        line = f"{row['rank']:>4} {row['dp']:>3} {row['pp']:>3} {row['tp']:>3} {stages:>8} " + (
            f"{mean:>16.4f}" if mean is not None else f"{'(no step ran)':>16}")
        if pred:
            line += f" {pred['step_time_s']:>17.4f}"
        lines.append(line)
    measured = doc["measured"]["step_time_s"]
    if measured is not None:
        label = "warm-up excluded" if doc["measured"]["warmup_excluded"] else "one step, warm-up included"
        lines.append(f"step time (slowest rank, {label}): {measured:.4f} s"
                     + (f"; predicted {pred['step_time_s']:.4f} s on {pred['profile']}" if pred else ""))
    lines.append("loss per step: " + ", ".join(f"{x:.6f}" for x in doc["losses"]))
    v = doc["verify"]
    if v:
        verdict = "PASSED" if v["passed"] else "FAILED"
        lines.append(f"verify {verdict}: loss rel err {v['loss_max_rel_err']:.2e}, parameters rel err "
                     f"{v['param_max_rel_err']:.2e} (worst {v['worst_param']}) over {v['params_compared']} "
                     f"tensors, tolerance {v['rtol']:g}")
        if v["zero_grad_params"]:
            lines.append(f"  {len(v['zero_grad_params'])} zero-gradient parameters (e.g. {v['zero_grad_params'][0]}) "
                         f"checked to an absolute drift bound instead")
        for problem in v["problems"]:
            lines.append(f"  {problem}")
    for note in doc["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
