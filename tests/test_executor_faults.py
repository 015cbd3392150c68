"""Faults: a rank killed or hung mid-run ends every rank with one clear error in bounded time, and a
run resumed from its torch.distributed.checkpoint reproduces the uninterrupted loss trajectory."""
from __future__ import annotations

import json
import time

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
    whole = runner.invoke(app, ["run", str(plan), *steps, "--workdir", str(tmp_path / "w0")])
    assert whole.exit_code == 0, whole.output
    uninterrupted = json.loads(whole.stdout)["losses"]

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
