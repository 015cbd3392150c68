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

from hardware_profiles import load_profile
from planner.commands.common import JsonOpt, emit_json
from planner.errors import ConfigError
from planner.executor.runspec import EXECUTOR_RUNS
from planner.io import check_directory
from planner.errors import PlannerError
from planner.estimate import estimate
from planner.executor import ExecutorError
from planner.executor.faults import parse_fault
from planner.executor.lifecycle import stop_signals
from planner.executor.runspec import build_run_spec, env_positive_int, fp8_line
from planner.parallel import ParallelConfig
from planner.plan import load_plan

RunPlanArg = Annotated[
    Optional[Path],
    typer.Argument(
        help="A plan JSON file written by `recommend --out` or `estimate --json` (none with --demo)."
    ),
]
DemoOpt = Annotated[
    bool,
    typer.Option(
        "--demo",
        help="Run a built-in plan instead of PLAN: a 4-block GPT (planner.executor.tiny:"
        "gpt_tiny) on 4 CPU ranks, dp=2 x pp=2 with 1F1B and ZeRO-2, written to the "
        "work directory; add --verify.",
    ),
]

DEMO_MODEL = "planner.executor.tiny:gpt_tiny"
DEMO_CONFIG = dict(
    dp=2,
    tp=1,
    pp=2,
    micro_batch=1,
    global_batch=8,
    zero=2,
    schedule="1f1b",
    seq=32,
    precision="fp32",
    placement="DPT",
)
"""The --demo plan: every rank of a 2-core machine busy, data and pipeline parallelism, seconds per
step."""


StepsOpt = Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps to run.")]
BackendOpt = Annotated[
    str, typer.Option("--backend", help="gloo (CPU processes) or nccl (one GPU per rank).")
]
VerifyOpt = Annotated[
    bool,
    typer.Option(
        "--verify", help="Compare loss and every parameter with a single-process reference."
    ),
]
ProxyOpt = Annotated[
    bool,
    typer.Option(
        "--proxy",
        help="If the model is too large here, run a shrunk model with the same parallel layout.",
    ),
]
CheckpointDirOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--checkpoint-dir",
        help="Save with torch.distributed.checkpoint (every step, or every plan.checkpoint_interval_s seconds); resume from the latest intact step.",
    ),
]
CheckpointEveryOpt = Annotated[
    Optional[int],
    typer.Option(
        "--checkpoint-every-steps",
        min=1,
        help="Save every N steps (overrides the plan's checkpoint_interval_s).",
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", min=0, help="Seed of the weights and the synthetic data.")
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout-s",
        min=1.0,
        help="A hung or frozen rank fails the run after this long (process-group timeout and heartbeat deadline).",
    ),
]
WorkdirOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--workdir",
        help=(
            "Folder in which each run makes a fresh sub-folder for its rank logs and heartbeats "
            "(default: a temporary directory); nothing already there is replaced or removed."
        ),
    ),
]
HardwareOpt = Annotated[
    Optional[str],
    typer.Option(
        "--hardware",
        help="Profile of the prediction column (default: cpu-local for gloo, the plan's hardware for nccl).",
    ),
]
FaultOpt = Annotated[
    Optional[str],
    typer.Option(
        "--inject-fault",
        hidden=True,
        help="Tests only: kill|hang|stop:RANK:STEP or bug:NAME (planner.executor.faults).",
    ),
]


def run(
    plan: RunPlanArg = None,
    steps: StepsOpt = 3,
    backend: BackendOpt = "gloo",
    verify: VerifyOpt = False,
    proxy: ProxyOpt = False,
    checkpoint_dir: CheckpointDirOpt = None,
    checkpoint_every_steps: CheckpointEveryOpt = None,
    seed: SeedOpt = 0,
    timeout_s: TimeoutOpt = 60.0,
    workdir: WorkdirOpt = None,
    hardware: HardwareOpt = None,
    json_out: JsonOpt = False,
    demo: DemoOpt = False,
    inject_fault: FaultOpt = None,
) -> None:
    """Run PLAN.json for real: per-rank step times beside the prediction, optionally verified."""
    _refuse_bad_options(inject_fault, workdir, checkpoint_dir, hardware)
    plan = _plan_or_demo(plan, demo, workdir)
    under_torchrun = _under_torchrun()
    spec = build_run_spec(
        plan,
        steps=steps,
        backend=backend,
        proxy=proxy,
        seed=seed,
        timeout_s=timeout_s,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
        fault=inject_fault,
        world_size_available=_torchrun_world_size() if under_torchrun else None,
        verify=verify,
        checkpoint_every_steps=checkpoint_every_steps,
    )
    if spec.config.precision == "fp8" and os.environ.get("RANK", "0") == "0":
        typer.echo(f"warning: {fp8_line(spec.backend)}", err=True)
    executed = _execute(spec, under_torchrun, workdir, verify)
    if executed is None:
        return  # a rank other than 0 under torchrun: rank 0 reports
    ranks, wall_s, where, verification = executed
    if hardware is None:
        hardware = "cpu-local" if spec.backend == "gloo" else load_plan(plan).hardware_name
    prediction, prediction_note = predict_step_time_s(spec, hardware)
    document = run_document(
        spec,
        ranks,
        wall_s=wall_s,
        workdir=where,
        verification=verification,
        prediction_s=prediction,
        prediction_note=prediction_note,
        profile=hardware,
    )
    if json_out:
        emit_json(document)
    else:
        typer.echo(render(document))
    if verification is not None and not verification.passed:
        raise ExecutorError(verification.message())


def _refuse_bad_options(inject_fault, workdir, checkpoint_dir, hardware) -> None:
    """One line, before the model is built and any rank starts: a bad fault, a folder that cannot
    be used, an unknown or invalid profile for the prediction column."""
    parse_fault(inject_fault)
    for folder, option in ((workdir, "--workdir"), (checkpoint_dir, "--checkpoint-dir")):
        if folder is not None:
            check_directory(folder, option)
    if hardware is not None:
        load_profile(hardware)


def _under_torchrun() -> bool:
    """Every rank runs this command under torchrun (its environment names the rank and world)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or {"RANK", "WORLD_SIZE", "MASTER_ADDR"} <= set(
        os.environ
    )


def _torchrun_world_size() -> int | None:
    """WORLD_SIZE under torchrun, with RANK and LOCAL_RANK checked below it."""
    world_env = env_positive_int("WORLD_SIZE")
    for name in ("RANK", "LOCAL_RANK"):
        rank_env = env_positive_int(name, minimum=0)
        if rank_env is not None and world_env is not None and rank_env >= world_env:
            raise ConfigError(
                name,
                os.environ[name],
                f"0..{world_env - 1} (below WORLD_SIZE, environment variable)",
            )
    return world_env


def _execute(spec, under_torchrun: bool, workdir: Path | None, verify: bool):
    """(ranks, wall seconds, work folder or None, verification or None) of the run: under torchrun
    this process's part (None on a rank that does not report), else world-size local processes;
    verified against one process with `verify`."""
    launched = None
    if under_torchrun:
        ranks, wall_s, where = _run_torchrun(spec)
        if ranks is None:
            return None
    else:
        # optional heavy dependency: planner.executor.launch imports torch at its top
        from planner.executor.launch import launch_local

        launched = launch_local(spec, workdir=workdir, keep_workdir=verify)
        ranks, wall_s, where = launched.ranks, launched.wall_s, launched.workdir
    if not verify:
        return ranks, wall_s, where, None
    # optional heavy dependency: planner.executor.verify imports torch at its top
    from planner.executor.verify import verify_run

    try:
        with stop_signals():
            verification = verify_run(
                spec,
                ranks,
                launched.workdir if launched else None,
                reference_model=launched.reference_model if launched else None,
            )
    finally:
        if launched is not None:
            launched.cleanup()
    if launched is not None and launched.temporary:
        where = None
    return ranks, wall_s, where, verification


def _plan_or_demo(plan: Path | None, demo: bool, workdir: Path | None) -> Path:
    """PLAN, or with --demo the built-in plan written as a new demo-plan-*.json (in --workdir, else
    a temporary folder)."""
    if demo == (plan is not None):
        raise ConfigError(
            "PLAN", None if plan is None else str(plan), "a plan file, or --demo (not both)"
        )
    if not demo:
        return plan
    import json
    import tempfile

    folder = workdir or Path(tempfile.mkdtemp(prefix="planner-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    # a new file every time: the work folder never loses a file the run did not write
    with tempfile.NamedTemporaryFile(
        "w", dir=folder, prefix="demo-plan-", suffix=".json", delete=False
    ) as out:
        out.write(json.dumps(demo_document()))
    path = Path(out.name)
    typer.echo(
        f"demo: {DEMO_MODEL} dp=2 x pp=2 (1F1B, ZeRO-2) on 4 CPU ranks; plan written to {path}",
        err=True,
    )
    return path


def demo_document() -> dict:
    """The --demo plan as `planner estimate --json` writes it (cpu-local), for the tiny GPT of the
    executor
    (imported here: the estimator and the model's torch are heavy for the rest of `run`)."""
    # optional heavy dependency: planner.executor.tiny imports torch at its top
    from planner.executor.tiny import gpt_tiny_spec

    cfg = ParallelConfig(framework="torchtitan", **DEMO_CONFIG)
    document = estimate(
        gpt_tiny_spec(), "cpu-local", cfg, gpus=cfg.world_size, check_framework=False
    ).to_document()
    document["model"]["name"] = DEMO_MODEL
    return document


def _run_torchrun(spec):
    """Every rank trains; rank 0 returns the gathered results (others return None)."""
    import time

    import torch.distributed as dist

    # optional heavy dependency: planner.executor.worker imports torch at its top
    from planner.executor.worker import train

    t0 = time.perf_counter()
    rank = int(os.environ["RANK"])
    ranks = train(
        spec,
        rank=rank,
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )
    dist.barrier()
    dist.destroy_process_group()
    return ranks, time.perf_counter() - t0, "torchrun"


run.__doc__ = (
    f"{run.__doc__}\n\nRuns {EXECUTOR_RUNS}. Other dimensions (expert_tp > 1, ep or a "
    f"mixture-of-experts model beside tp > 1, cp with sliding windows or sinks) are refused in one "
    f"line (exit 2)."
)


def predict_step_time_s(spec, profile: str = "cpu-local") -> tuple[float | None, str | None]:
    """The cost model's step time for what actually ran (the run's model and precision) on
    `profile`; None with a note when the profile cannot be loaded."""
    try:
        hw = load_profile(profile)
    except PlannerError as err:
        return None, f"prediction column left out: hardware profile {profile!r} unavailable ({err})"
    # what ran is the embedded executor, a torchtitan-style stack (frameworks/torchtitan.json)
    config = dataclasses.replace(
        spec.config, precision=spec.dtype, offload=spec.offload, framework="torchtitan"
    )
    try:
        result = estimate(spec.model, hw, config, gpus=config.world_size, check_framework=False)
    except PlannerError as err:  # a dimension the cost model of this build does not cost (yet)
        return (
            None,
            f"prediction column left out: the cost model does not estimate this plan ({err})",
        )
    return float(result.step_time_s), None


def run_document(
    spec,
    ranks,
    *,
    wall_s,
    workdir,
    verification,
    prediction_s,
    prediction_note,
    profile: str = "cpu-local",
) -> dict:
    """The one object both the table and --json print."""
    rows = []
    for r in sorted(ranks, key=lambda r: r["rank"]):
        times = r["step_times_s"]
        steady = times[1:] if len(times) > 1 else times
        rows.append(
            {
                "rank": r["rank"],
                **r["coords"],
                "stages": r["stages"],
                "step_times_s": times,
                "mean_step_time_s": statistics.fmean(steady) if steady else None,
            }
        )
    means = [row["mean_step_time_s"] for row in rows if row["mean_step_time_s"] is not None]
    warmup_excluded = max((len(r["step_times_s"]) for r in ranks), default=0) > 1
    how = (
        "slowest rank's mean over steps after the first (warm-up excluded)"
        if warmup_excluded
        else "slowest rank's only step (includes warm-up: run 2 or more steps to exclude it)"
    )
    notes = list(spec.notes)
    if prediction_note:
        notes.append(prediction_note)
    start = ranks[0]["start_step"]
    if start:
        notes.append(
            f"resumed from {spec.checkpoint_dir} after step {start - 1}; steps {start}..{spec.steps - 1} ran now"
        )
    if spec.checkpoint_dir:
        saved = ranks[0].get("checkpoints", [])
        notes.append(
            f"checkpoints saved after step(s) {', '.join(map(str, saved)) or 'none'} in {spec.checkpoint_dir}"
        )
    return {
        "schema_version": "1",
        "model": {"name": spec.model_name, "ran": dataclasses.asdict(spec.model)},
        "plan": spec.config.to_dict(),
        "backend": spec.backend,
        "precision_used": spec.dtype,
        "world_size": spec.config.world_size,
        "steps": spec.steps,
        "seed": spec.seed,
        "losses": ranks[0]["losses"],
        "checkpoints": ranks[0].get("checkpoints", []),
        "ranks": rows,
        "measured": {
            "step_time_s": max(means) if means else None,
            "warmup_excluded": warmup_excluded,
            "note": how,
        },
        "prediction": (
            {"step_time_s": prediction_s, "profile": profile} if prediction_s is not None else None
        ),
        "verify": verification.to_dict() if verification is not None else None,
        "launch_wall_s": wall_s,
        "workdir": workdir,
        "notes": notes,
    }


def render(doc: dict) -> str:
    cfg = doc["plan"]
    extra = "".join(
        f"{name}={cfg[name]}{suffix} "
        for name, suffix, on in (
            ("cp", f" cp_comm={cfg['cp_comm']}", cfg["cp"] > 1),
            ("ep", "", cfg["ep"] > 1),
            ("dp_shard", "", 0 < cfg["dp_shard"] < cfg["dp"]),
        )
        if on
    )
    lines = [
        f"ran {doc['model']['name']} on {doc['world_size']} {doc['backend']} ranks: dp={cfg['dp']} tp={cfg['tp']} "
        f"pp={cfg['pp']} {extra}schedule={cfg['schedule']} v={cfg['virtual_stages']} zero={cfg['zero']} "
        f"recompute={cfg['recompute']}"
        + (f"({cfg['recompute_layers']}/chunk)" if cfg.get("recompute_layers") else "")
        + f" sp={cfg['sequence_parallel']} placement={cfg['placement']} "
        f"precision={doc['precision_used']}, {doc['steps']} steps"
    ]
    pred = doc["prediction"]
    axes = ["dp", "pp", "tp"] + [a for a in ("cp", "ep") if cfg[a] > 1]  # each rank's coordinates
    header = (
        f"{'rank':>4} "
        + " ".join(f"{a:>3}" for a in axes)
        + f" {'stages':>8} {'measured s/step':>16}"
    )
    if pred:
        header += f" {'predicted s/step':>17}"
    lines.append(header)
    for row in doc["ranks"]:
        stages = ",".join(map(str, row["stages"]))
        mean = row["mean_step_time_s"]
        line = (
            f"{row['rank']:>4} "
            + " ".join(f"{row.get(a, 0):>3}" for a in axes)
            + f" {stages:>8} "
            + (f"{mean:>16.4f}" if mean is not None else f"{'(no step ran)':>16}")
        )
        if pred:
            line += f" {pred['step_time_s']:>17.4f}"
        lines.append(line)
    measured = doc["measured"]["step_time_s"]
    if measured is not None:
        label = (
            "warm-up excluded"
            if doc["measured"]["warmup_excluded"]
            else "one step, warm-up included"
        )
        lines.append(
            f"step time (slowest rank, {label}): {measured:.4f} s"
            + (f"; predicted {pred['step_time_s']:.4f} s on {pred['profile']}" if pred else "")
        )
    lines.append("loss per step: " + ", ".join(f"{x:.6f}" for x in doc["losses"]))
    v = doc["verify"]
    if v:
        verdict = "PASSED" if v["passed"] else "FAILED"
        steps = v["steps"]
        span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
        lines.append(
            f"verify {verdict}: {span}, {v['params_compared']} tensors, each against its fp32 rounding "
            f"bound (error/bound must stay <= 1); largest ratios:"
        )
        for kind, worst in v["worst"].items():
            ratio = "inf" if worst["ratio"] is None else f"{worst['ratio']:.3g}"
            where = f"step {worst['step']}" + (f", {worst['tensor']}" if worst["tensor"] else "")
            lines.append(f"  {kind:<18} {ratio:>9}  ({where})")
        if v["first_failure"]:
            f = v["first_failure"]
            lines.append(
                f"  first over its bound: {f['kind']} at step {f['step']}"
                + (f", {f['tensor']}" if f["tensor"] else "")
            )
        for problem in v["problems"]:
            lines.append(f"  {problem}")
        for note in v["notes"]:
            lines.append(f"  note: {note}")
    for note in doc["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
