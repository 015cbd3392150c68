"""Faults: a rank killed or hung mid-run ends every rank with one clear error in bounded time, and a
run resumed from its torch.distributed.checkpoint reproduces the uninterrupted loss trajectory."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from executor_plans import write_plan
from planner.cli import app
from planner.parallel import ParallelConfig

runner = CliRunner()


def _plan(tmp_path):
    # ZeRO-2 (FSDP2) so the checkpoint holds sharded parameters and optimizer states
    cfg = ParallelConfig(dp=2, zero=2, global_batch=4, micro_batch=1, seq=32, precision="fp32")
    return write_plan(tmp_path / "plan.json", cfg)


@pytest.mark.multiprocess
def test_killed_rank_stops_all_and_resume_reproduces_the_uninterrupted_losses(tmp_path):
    plan = _plan(tmp_path)
    steps = ["--steps", "4", "--json"]
    before = set(Path(tempfile.gettempdir()).glob("planner-run-*"))
    whole = runner.invoke(app, ["run", str(plan), *steps])
    assert whole.exit_code == 0, whole.output
    uninterrupted = json.loads(whole.stdout)["losses"]
    # a successful run removes its temporary work directory (result.pt holds every parameter)
    assert json.loads(whole.stdout)["workdir"] is None
    assert set(Path(tempfile.gettempdir()).glob("planner-run-*")) <= before

    ckpt = tmp_path / "ckpt"
    t0 = time.monotonic()
    killed = runner.invoke(app, ["run", str(plan), *steps, "--checkpoint-dir", str(ckpt), "--inject-fault", "kill:1:2",
                                 "--workdir", str(tmp_path / "w1")])
    elapsed = time.monotonic() - t0
    assert killed.exit_code == 1
    lines = [line for line in killed.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "rank 1 was killed by SIGKILL during step 2" in lines[0] and "stopped all 2 ranks" in lines[0]
    assert elapsed < 60
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-0", "step-1"]

    resumed = runner.invoke(app, ["run", str(plan), *steps, "--checkpoint-dir", str(ckpt),
                                  "--workdir", str(tmp_path / "w2")])
    assert resumed.exit_code == 0, resumed.output
    doc = json.loads(resumed.stdout)
    assert len(doc["ranks"][0]["step_times_s"]) == 2  # only steps 2 and 3 ran now
    assert any("resumed" in n for n in doc["notes"])
    assert doc["losses"] == pytest.approx(uninterrupted, abs=1e-6)

    # refused before launching, one line each: another run's checkpoint, nothing left to run, a file
    for argv, needle in [(["--steps", "6", "--seed", "1"], "seed 0 -> 1"),
                         (["--steps", "4"], "already holds steps 0..3")]:
        refused = runner.invoke(app, ["run", str(plan), *argv, "--checkpoint-dir", str(ckpt)])
        assert refused.exit_code == 2, refused.output
        assert needle in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    refused = runner.invoke(app, ["run", str(plan), "--checkpoint-dir", str(not_a_dir)])
    assert refused.exit_code == 2 and "a directory (it is a file)" in refused.stderr


@pytest.mark.multiprocess
def test_hung_rank_fails_every_rank_within_the_timeout(tmp_path):
    plan = _plan(tmp_path)
    t0 = time.monotonic()
    result = runner.invoke(app, ["run", str(plan), "--steps", "3", "--timeout-s", "5", "--inject-fault", "hang:1:1",
                                 "--workdir", str(tmp_path / "w")])
    elapsed = time.monotonic() - t0
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: rank 0 failed during step 1") and "stopped all 2 ranks" in lines[0]
    assert "rank 1 is alive but silent" in lines[0]
    assert elapsed < 60


def test_torchrun_with_the_wrong_world_size_names_the_launch_fix(tmp_path):
    plan = _plan(tmp_path)                                    # dp=2: two ranks
    env = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    result = runner.invoke(app, ["run", str(plan)], env=env)
    assert result.exit_code == 2
    assert "needs 2 ranks (dp*tp*pp) but torchrun started WORLD_SIZE=3" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
