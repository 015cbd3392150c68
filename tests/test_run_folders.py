"""`planner run`'s folders (issue 31): a --workdir gets a fresh sub-folder per run, so the user's
own files there are never replaced or removed; a --workdir or --checkpoint-dir that cannot be
written is one line, exit 2, before the model is built or any rank starts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from executor_plans import write_plan
from planner.cli import app
from planner.parallel import ParallelConfig

runner = CliRunner()

USERS_FILES = {
    "result.pt": b"my results",
    "rank-0.log": b"my log",
    "runspec.json": b'{"mine": 1}',
    "params-r0.pt": b"my params",
    "heartbeat-0.json": b"{}",
    "error-0.json": b"{}",
}
"""Names the launcher writes in its work folder (the first pass found each deleted or
overwritten)."""


def _plan(tmp_path):
    return write_plan(
        tmp_path / "plan.json",
        ParallelConfig(dp=2, global_batch=2, micro_batch=1, seq=16, precision="fp32"),
    )


def _snapshot(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.multiprocess
def test_a_workdir_holding_the_users_files_keeps_them_and_the_run_gets_its_own_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name, content in USERS_FILES.items():
        (work / name).write_bytes(content)
    result = runner.invoke(
        app,
        ["run", str(_plan(tmp_path)), "--steps", "2", "--verify", "--json", "--workdir", str(work)],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    own = work / doc["workdir"]
    assert own.parent == work and own.name.startswith("run-") and (own / "rank-0.log").is_file()
    after = _snapshot(work)
    assert {
        k: v for k, v in after.items() if "/" not in k
    } == USERS_FILES  # every byte of the user's kept
    second = runner.invoke(
        app, ["run", str(_plan(tmp_path)), "--steps", "1", "--json", "--workdir", str(work)]
    )
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["workdir"] != doc["workdir"]  # one fresh folder per run
    assert {k: v for k, v in _snapshot(work).items() if k in after} == after


def _read_only(tmp_path):
    return "/sys/planner-run"  # root writes anywhere but here (sysfs refuses new files)


@pytest.mark.parametrize(
    "option,make,needle",
    [
        ("--workdir", lambda t: t / "file", "is a file, not a directory"),
        (
            "--workdir",
            lambda t: t / "file" / "sub",
            "cannot create it: {t}/file is a file, not a directory",
        ),
        ("--workdir", _read_only, "cannot create it: /sys is not writable"),
        ("--checkpoint-dir", _read_only, "cannot create it: /sys is not writable"),
        ("--checkpoint-dir", lambda t: t / "file", "is a file, not a directory"),
    ],
)
def test_a_folder_the_run_cannot_write_is_one_line_before_any_rank(
    tmp_path, monkeypatch, option, make, needle
):
    (tmp_path / "file").write_text("x")
    plan = _plan(tmp_path)
    import planner.commands.run as run_command
    import planner.executor.runspec as runspec

    def no_build(*args, **kwargs):  # the check comes before the model is built
        raise AssertionError("the run spec was built")

    monkeypatch.setattr(runspec, "build_run_spec", no_build)
    monkeypatch.setattr(run_command, "build_run_spec", no_build)  # the name `planner run` imported
    before = _snapshot(tmp_path)
    path = make(tmp_path)
    result = runner.invoke(app, ["run", str(plan), option, str(path)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert (
        lines[0].startswith(f"error: {option} {path}: ") and needle.format(t=tmp_path) in lines[0]
    ), lines
    assert _snapshot(tmp_path) == before
