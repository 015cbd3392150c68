"""The adversarial harness (issue 31): every case is the real `planner` command in its own process
and session, in a sandbox folder of the user's files. Each must end with the documented exit code (2
for bad input), exactly one stderr line and no traceback, leave no process of its session behind,
and change no file of the sandbox.

Grow CASES with every input kind a command takes: (id, argv, exit code, a part of the one line). In
argv, {tmp} is the sandbox, {plan} a genuine plan (estimate --json of gpt2 on 8 H100s) and
{plan:NAME} that plan edited by EDITS[NAME] as a user might by hand. `python -m pytest
tests/adversarial -q` runs them all."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EDITS = {
    "ep-dense": lambda d: d["plan"].update(ep=2, placement="DEPT"),
    "tp-over-heads": lambda d: d["plan"].update(
        tp=8, dp=1, num_microbatches=d["plan"]["global_batch"] // d["plan"]["micro_batch"]
    ),
    "hidden": lambda d: d["model"].update(hidden=12289),
    "params": lambda d: d["model"].update(params=1),
    "mfu": lambda d: d["prediction"].update(mfu=7.5),
    "step-time": lambda d: d["prediction"].update(step_time_s=-1.0),
    "negative-time": lambda d: d["prediction"]["time_breakdown_s"].update(compute=-0.5),
    "fp8-scaling": lambda d: d["software"].update(fp8_scaling="rowwise"),
    "framework-blank": lambda d: d["plan"].update(framework=""),
}
"""Hand edits of a plan that no reader may trust (explain and export printed and exported them)."""

READERS = [
    ["explain", "{plan:%s}"],
    ["export", "{plan:%s}", "--format", "megatron"],
    ["export", "{plan:%s}", "--format", "deepspeed"],
    ["report", "{plan:%s}", "--out", "{tmp}/report"],
    ["run", "{plan:%s}"],
]

PLAN_NEEDLES = {
    "ep-dense": "ep=2 is invalid: allowed 1 for a dense model",
    "tp-over-heads": "tp=8 is invalid: allowed a divisor of heads(12)",
    "hidden": "model.hidden=12289 does not match",
    "params": "model.params=1 does not match",
    "mfu": "prediction.mfu=7.5 is impossible",
    "step-time": "prediction.step_time_s=-1.0 is invalid",
    "negative-time": "prediction.time_breakdown_s.compute=-0.5 is invalid",
    "fp8-scaling": "--fp8-scaling rowwise, --precision amp-bf16",
    "framework-blank": "framework=''",
}

CASES = [
    # calibrate --out: read before anything is measured, bounded, never a special file
    (
        "calibrate-dev-zero",
        ["hardware", "calibrate", "--quick", "--out", "/dev/zero"],
        2,
        "is a character device",
    ),
    (
        "calibrate-dev-full",
        ["hardware", "calibrate", "--quick", "--out", "/dev/full"],
        2,
        "is a character device",
    ),
    ("calibrate-fifo", ["hardware", "calibrate", "--quick", "--out", "{tmp}/fifo"], 2, "is a FIFO"),
    # refused before planner.cli loads (planner.__main__.early_refusal): --out=X, --out twice, a
    # folder, --gpus before --out; the message is the command's own
    (
        "calibrate-out-equals-dev-zero",
        ["hardware", "calibrate", "--quick", "--out=/dev/zero"],
        2,
        "is a character device",
    ),
    (
        "calibrate-last-out-counts",
        ["hardware", "calibrate", "--out", "{tmp}/p.json", "--quick", "--out", "{tmp}/fifo"],
        2,
        "is a FIFO",
    ),
    (
        "calibrate-out-folder",
        ["hardware", "calibrate", "--quick", "--out", "{tmp}"],
        2,
        "is a directory",
    ),
    (
        "calibrate-gpus-then-missing-folder",
        ["hardware", "calibrate", "--gpus", "2", "--out", "{tmp}/missing/p.json"],
        2,
        "does not exist",
    ),
    (
        "calibrate-array",
        ["hardware", "calibrate", "--quick", "--out", "{tmp}/array.json"],
        2,
        "found an array",
    ),
    (
        "calibrate-not-a-profile",
        ["hardware", "calibrate", "--quick", "--out", "{tmp}/mine.json"],
        2,
        "exists and is not a hardware profile",
    ),
    (
        "calibrate-under-a-file",
        ["hardware", "calibrate", "--quick", "--out", "{tmp}/notes.txt/p.json"],
        2,
        "is not a directory",
    ),
    (
        "calibrate-read-only",
        ["hardware", "calibrate", "--quick", "--out", "/sys/p.json"],
        2,
        "is not writable",
    ),
    # run's folders and hardware, before any rank
    (
        "run-workdir-file",
        ["run", "{plan}", "--workdir", "{tmp}/notes.txt"],
        2,
        "is a file, not a directory",
    ),
    ("run-workdir-read-only", ["run", "{plan}", "--workdir", "/sys/w"], 2, "/sys is not writable"),
    (
        "run-checkpoint-read-only",
        ["run", "{plan}", "--checkpoint-dir", "/sys/c"],
        2,
        "/sys is not writable",
    ),
    (
        "run-hardware-unknown",
        ["run", "{plan}", "--hardware", "tpu-v9"],
        2,
        "hardware='tpu-v9' is invalid",
    ),
    (
        "run-hardware-zero-bandwidth",
        ["run", "{plan}", "--hardware", "{tmp}/zero-bw.json"],
        2,
        "memory_bandwidth_GBps=0 is invalid",
    ),
    # option combinations that mean nothing
    (
        "estimate-fp8-scaling-bf16",
        [
            "estimate",
            "gpt2",
            "--hardware",
            "dgx-h100",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--fp8-scaling",
            "rowwise",
            "--precision",
            "amp-bf16",
        ],
        2,
        "--fp8-scaling rowwise, --precision amp-bf16",
    ),
    (
        "estimate-modules-without-selective",
        [
            "estimate",
            "gpt2",
            "--hardware",
            "dgx-h100",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--recompute",
            "none",
            "--recompute-modules",
            "mlp",
        ],
        2,
        "--recompute-modules mlp, --recompute none",
    ),
    (
        "estimate-framework-blank",
        [
            "estimate",
            "gpt2",
            "--hardware",
            "dgx-h100",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--framework",
            "",
        ],
        2,
        "--framework '': means nothing",
    ),
    (
        "recommend-cost-without-price",
        ["recommend", "gpt2", "--hardware", "cpu-local", "--gpus", "2", "--objective", "cost"],
        2,
        "has no price_usd_per_hour",
    ),
    (
        "report-cost-without-price",
        [
            "report",
            "gpt2",
            "--hardware",
            "cpu-local",
            "--gpus",
            "2",
            "--objective",
            "cost",
            "--out",
            "{tmp}/report",
        ],
        2,
        "has no price_usd_per_hour",
    ),
    (
        "estimate-gpt-oss-head-dim-63",
        ["estimate", "{tmp}/oss63.json", "--hardware", "dgx-h100", "--gpus", "8", "--dp", "8"],
        2,
        "head_dim=63 is invalid",
    ),
    (
        "estimate-framework-profile-fifo",
        [
            "estimate",
            "gpt2",
            "--hardware",
            "dgx-h100",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--framework",
            "{tmp}/fifo.json",
        ],
        2,
        "is a FIFO, not a regular file",
    ),
    (
        "estimate-hardware-profile-device",
        ["estimate", "gpt2", "--hardware", "/dev/zero", "--gpus", "8"],
        2,
        "is a character device",
    ),
    (
        "export-out-fifo",
        ["export", "{plan}", "--format", "deepspeed", "--out", "{tmp}/fifo"],
        2,
        "is a FIFO that no process reads",
    ),
    *[
        (
            "-".join([reader[0], *reader[3:4], edit]),
            [a.replace("%s", edit) for a in reader],
            2,
            PLAN_NEEDLES[edit],
        )
        for edit in EDITS
        for reader in READERS
    ],
]


def _sandbox(tmp: Path) -> None:
    """The user's files the commands must leave as they are."""
    os.mkfifo(tmp / "fifo")
    os.mkfifo(tmp / "fifo.json")
    (tmp / "array.json").write_text("[1, 2]")
    (tmp / "mine.json").write_text('{"mine": true}')
    (tmp / "notes.txt").write_text("my notes")
    (tmp / "oss63.json").write_text('{"model_type": "gpt_oss", "head_dim": 63}')
    profile = json.loads((ROOT / "hardware_profiles" / "cpu-local.json").read_text())
    profile["memory_bandwidth_GBps"] = 0
    (tmp / "zero-bw.json").write_text(json.dumps(profile))


@pytest.fixture(scope="module")
def genuine_plan() -> dict:
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(
        app, ["estimate", "gpt2", "--hardware", "dgx-h100", "--gpus", "8", "--dp", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _materialize(argv: list[str], tmp: Path, plan: dict) -> list[str]:
    out = []
    for arg in argv:
        if arg.startswith("{plan"):
            name = arg[6:-1] if ":" in arg else "genuine"
            doc = copy.deepcopy(plan)
            if name != "genuine":
                EDITS[name](doc)
            path = tmp / f"plan-{name}.json"
            path.write_text(json.dumps(doc))
            arg = str(path)
        out.append(arg.replace("{tmp}", str(tmp)))
    return out


def _snapshot(tmp: Path) -> dict:
    return {
        str(p.relative_to(tmp)): (p.read_bytes() if p.is_file() else p.stat().st_mode)
        for p in sorted(tmp.rglob("*"))
    }


def session_processes(sid: int) -> list[int]:
    """Live processes of session `sid` (a command started with start_new_session: its ranks and
    helpers)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            left.append(int(stat.parent.name))
    return left


def run_case(argv: list[str], *, timeout: float = 120, stop_after_s: float | None = None):
    """The command in its own session; with `stop_after_s`, SIGTERM after that long.
    (exit code, stdout, stderr, session pids left)"""
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    if stop_after_s is not None:
        time.sleep(stop_after_s)
        os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=timeout)
    deadline = time.monotonic() + 5
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.returncode, out, err, session_processes(proc.pid)


def _tiered(cases):
    """The first case of each command in the default run, the others in the slow tier (each case
    is a process that imports the CLI: about 1.4 s on two cores)."""
    seen = set()
    for case in cases:
        command = case[1][0]
        yield pytest.param(case, id=case[0], marks=[pytest.mark.slow] * (command in seen))
        seen.add(command)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(_tiered(CASES)))
def test_case_is_one_line_with_its_exit_code_and_touches_nothing(case, tmp_path, genuine_plan):
    _, argv, code, needle = case
    _sandbox(tmp_path)
    argv = _materialize(argv, tmp_path, genuine_plan)
    before = _snapshot(tmp_path)
    rc, out, err, left = run_case(argv)
    lines = err.strip().splitlines()
    assert rc == code, (argv, rc, err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (argv, err)
    assert "Traceback" not in err and out == ""
    assert left == [], f"processes left behind: {left}"
    assert _snapshot(tmp_path) == before


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("after_s", [1.0, pytest.param(3.0, marks=pytest.mark.slow)])
def test_sigterm_before_the_ranks_start_is_one_line(tmp_path, after_s):
    """Issue 31: SIGTERM while `planner run` imports and builds exited 143 with nothing said."""
    sys.path.insert(0, str(ROOT / "tests"))
    from executor_plans import write_plan
    from planner.parallel import ParallelConfig

    plan = write_plan(
        tmp_path / "plan.json",
        ParallelConfig(dp=2, global_batch=2, micro_batch=1, seq=16, precision="fp32"),
    )
    rc, _, err, left = run_case(["run", str(plan), "--steps", "1000"], stop_after_s=after_s)
    lines = err.strip().splitlines()
    assert (
        rc == 128 + signal.SIGTERM
        and len(lines) == 1
        and lines[0].startswith("error: stopped by SIGTERM")
    ), err
    assert "Traceback" not in err and left == []
