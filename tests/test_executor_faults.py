"""Faults: a rank killed, hung or frozen mid-run ends every rank with one clear error in bounded time;
a signal to the launcher stops every rank; a run resumed from its torch.distributed.checkpoint (the
last intact step, when the latest is damaged) reproduces the uninterrupted loss trajectory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from executor_plans import plan_document, write_plan
from planner.cli import app
from planner.parallel import ParallelConfig
from tests.fixtures.processes import alive as _alive, children as _children

runner = CliRunner()


def _plan(tmp_path):
    # ZeRO-2 (FSDP2) so the checkpoint holds sharded parameters and optimizer states
    cfg = ParallelConfig(dp=2, zero=2, global_batch=4, micro_batch=1, seq=32, precision="fp32")
    return write_plan(tmp_path / "plan.json", cfg)


@pytest.mark.multiprocess
def test_killed_rank_stops_all_and_resume_reproduces_the_uninterrupted_losses(
    tmp_path, monkeypatch
):
    plan = _plan(tmp_path)
    steps = ["--steps", "4", "--json"]
    # a temporary directory of this test's own: other test workers run `planner run` meanwhile
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = set(Path(tempfile.gettempdir()).glob("planner-run-*"))
    whole = runner.invoke(app, ["run", str(plan), *steps])
    assert whole.exit_code == 0, whole.output
    uninterrupted = json.loads(whole.stdout)["losses"]
    # a successful run removes its temporary work directory (result.pt holds every parameter)
    assert json.loads(whole.stdout)["workdir"] is None
    assert set(Path(tempfile.gettempdir()).glob("planner-run-*")) <= before

    ckpt = tmp_path / "ckpt"
    t0 = time.monotonic()
    killed = runner.invoke(
        app,
        [
            "run",
            str(plan),
            *steps,
            "--checkpoint-dir",
            str(ckpt),
            "--inject-fault",
            "kill:1:3",
            "--workdir",
            str(tmp_path / "w1"),
        ],
    )
    elapsed = time.monotonic() - t0
    assert killed.exit_code == 1
    lines = [line for line in killed.output.splitlines() if line.strip()]
    assert (
        len(lines) == 1
        and "rank 1 was killed by SIGKILL during step 3" in lines[0]
        and "stopped all 2 ranks" in lines[0]
    )
    assert elapsed < 60
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-0", "step-1", "step-2"]

    # the latest step is damaged (a shard cut short): the launcher falls back to step 1 and says so
    shard = max((ckpt / "step-2").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:100])
    resumed = runner.invoke(
        app,
        [
            "run",
            str(plan),
            *steps,
            "--checkpoint-dir",
            str(ckpt),
            "--verify",
            "--workdir",
            str(tmp_path / "w2"),
        ],
    )
    assert resumed.exit_code == 0, resumed.output
    assert "checkpoint step 2" in resumed.stderr and "resuming from step 1" in resumed.stderr
    assert (ckpt / "step-2.damaged").is_dir()
    doc = json.loads(resumed.stdout)
    assert len(doc["ranks"][0]["step_times_s"]) == 2  # only steps 2 and 3 ran now
    assert any("resumed" in n for n in doc["notes"])
    assert doc["losses"] == pytest.approx(uninterrupted, abs=1e-6)
    assert doc["verify"]["passed"] and doc["verify"]["steps"] == [2, 3], doc["verify"]

    # refused before launching, one line each: another run's checkpoint, nothing left to run, a file
    for argv, needle in [
        (["--steps", "6", "--seed", "1"], "seed 0 -> 1"),
        (["--steps", "4"], "already holds steps 0..3"),
    ]:
        refused = runner.invoke(app, ["run", str(plan), *argv, "--checkpoint-dir", str(ckpt)])
        assert refused.exit_code == 2, refused.output
        assert needle in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    refused = runner.invoke(app, ["run", str(plan), "--checkpoint-dir", str(not_a_dir)])
    assert (
        refused.exit_code == 2
        and f"--checkpoint-dir {not_a_dir}: is a file, not a directory" in refused.stderr
    )
    # no intact step at all: one line, exit 2, before any rank starts
    for step in ckpt.glob("step-*"):
        if (step / "trainer.json").exists():
            (step / "trainer.json").unlink()
    refused = runner.invoke(app, ["run", str(plan), *steps, "--checkpoint-dir", str(ckpt)])
    assert refused.exit_code == 2 and "no intact checkpoint" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.multiprocess
def test_hung_rank_fails_every_rank_within_the_timeout(tmp_path):
    plan = _plan(tmp_path)
    t0 = time.monotonic()
    result = runner.invoke(
        app,
        [
            "run",
            str(plan),
            "--steps",
            "3",
            "--timeout-s",
            "5",
            "--inject-fault",
            "hang:1:1",
            "--workdir",
            str(tmp_path / "w"),
        ],
    )
    elapsed = time.monotonic() - t0
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert (
        len(lines) == 1
        and lines[0].startswith("error: rank 0 failed during step 1")
        and "stopped all 2 ranks" in lines[0]
    )
    assert "rank 1 is alive but silent" in lines[0]
    assert elapsed < 60


def test_torchrun_with_the_wrong_world_size_names_the_launch_fix(tmp_path):
    plan = _plan(tmp_path)  # dp=2: two ranks
    env = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    result = runner.invoke(app, ["run", str(plan)], env=env)
    assert result.exit_code == 2
    assert "needs 2 ranks (dp*tp*pp*cp) but torchrun started WORLD_SIZE=3" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.multiprocess
def test_checkpoint_cadence_follows_the_plan_interval_and_the_step_option(tmp_path):
    cfg = ParallelConfig(dp=2, zero=2, global_batch=4, micro_batch=1, seq=32, precision="fp32")
    saved = {}
    for interval, extra, steps in (
        (1e-9, [], 3),
        (1e9, [], 3),
        (1e9, ["--checkpoint-every-steps", "2"], 5),
    ):
        doc = plan_document(cfg)
        doc["plan"]["checkpoint_interval_s"] = interval
        plan = tmp_path / f"plan-{len(saved)}.json"
        plan.write_text(json.dumps(doc))
        ckpt = tmp_path / f"ckpt-{len(saved)}"
        result = runner.invoke(
            app,
            [
                "run",
                str(plan),
                "--steps",
                str(steps),
                "--checkpoint-dir",
                str(ckpt),
                "--json",
                *extra,
            ],
        )
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        saved[(interval, bool(extra))] = out["checkpoints"]
        assert sorted(p.name for p in ckpt.iterdir()) == [f"step-{s}" for s in out["checkpoints"]]
    # a tiny interval: every step; an interval longer than the run: only the last step;
    # --checkpoint-every-steps 2 overrides the plan: steps 1, 3 and the last
    assert saved == {(1e-9, False): [0, 1, 2], (1e9, False): [2], (1e9, True): [1, 3, 4]}


_LAUNCHED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_launcher_outlives_its_test():
    """A test that fails before its launcher ends (a communicate() timeout on a loaded machine)
    left a `planner run --steps 1000000` training for the rest of the session; kill it (its ranks
    die with it, PR_SET_PDEATHSIG)."""
    yield
    while _LAUNCHED:
        launcher = _LAUNCHED.pop()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _launch_forever(tmp_path, *extra) -> tuple[subprocess.Popen, Path, list[int]]:
    """`planner run` for (practically) ever in its own session; returns once every rank is at step 1+,
    with the launcher, its work directory and the ranks' pids."""
    plan = write_plan(
        tmp_path / "plan.json",
        ParallelConfig(dp=2, global_batch=2, micro_batch=1, seq=16, precision="fp32"),
    )
    work = tmp_path / "work"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner",
            "run",
            str(plan),
            "--steps",
            "1000000",
            "--workdir",
            str(work),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    _LAUNCHED.append(launcher)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        # the run's own fresh sub-folder of --workdir
        beats = [
            json.loads(p.read_text())
            for p in sorted(work.glob("run-*/heartbeat-*.json"))
            if p.stat().st_size
        ]
        if len(beats) == 2 and all(b["step"] >= 1 for b in beats):
            pids = sorted(_children(launcher.pid))
            assert sorted(b["pid"] for b in beats) == pids
            (own,) = work.glob("run-*")
            return launcher, own, pids
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.2)
    launcher.kill()
    raise AssertionError("the ranks did not reach step 1")


def _assert_all_gone(pids: list[int], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "a rank outlived its launcher"


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(s, marks=pytest.mark.slow)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)
    ],
    ids=lambda s: s.name,
)
def test_a_signal_to_the_launcher_stops_every_rank(tmp_path, sig):
    """What timeout, Slurm and Kubernetes do (SIGTERM), Ctrl-C (SIGINT), a closed terminal (SIGHUP), and a
    launcher killed outright (SIGKILL: the ranks die with it, prctl PR_SET_PDEATHSIG)."""
    launcher, own, pids = _launch_forever(tmp_path)
    t0 = time.monotonic()
    os.kill(launcher.pid, sig)
    _, err = launcher.communicate(timeout=30)
    assert time.monotonic() - t0 < 15
    _assert_all_gone(pids)
    if sig == signal.SIGKILL:
        assert launcher.returncode == -sig
        return
    assert launcher.returncode == 128 + sig, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"error: stopped by {sig.name}: stopped all 2 ranks (logs: {own})"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_frozen_rank_fails_the_run_after_timeout_s(tmp_path):
    """SIGSTOP freezes a rank, its heartbeat thread included: the run fails after --timeout-s (5 s here),
    not after a fixed two minutes, and the stopped rank is killed too."""
    launcher, _, pids = _launch_forever(tmp_path, "--timeout-s", "5")
    t0 = time.monotonic()
    os.kill(pids[1], signal.SIGSTOP)
    _, err = launcher.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert launcher.returncode == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "stopped all 2 ranks" in lines[0], err
    # whichever sees it first: the peers' collective timeout or the heartbeat deadline, both --timeout-s
    assert "rank 1 is stopped (SIGSTOP" in lines[0] or "rank 1 stopped responding" in lines[0], (
        lines[0]
    )
    assert 4 < elapsed < 20
    _assert_all_gone(pids)


@pytest.mark.multiprocess
def test_a_native_crash_names_the_python_call_it_died_in(tmp_path):
    """Issue 31: a rank killed by SIGSEGV inside native code (the intermittent crash of the 8-rank gpt2 run) is one
    line naming the signal, the step and the innermost Python call of the crashing thread, which faulthandler wrote
    to the rank's log with the whole stack."""
    result = runner.invoke(
        app,
        [
            "run",
            str(_plan(tmp_path)),
            "--steps",
            "3",
            "--inject-fault",
            "segv:1:1",
            "--workdir",
            str(tmp_path / "w"),
        ],
    )
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert (
        len(lines) == 1
        and "rank 1 was killed by SIGSEGV during step 1 in inject_fault (faults.py:" in lines[0]
    )
    (own,) = (tmp_path / "w").glob("run-*")
    log = (own / "rank-1.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log and "in inject_fault" in log


def test_a_crash_in_a_thread_without_python_frames_is_not_blamed_on_another_thread(tmp_path):
    """faulthandler marks no thread current when the crashing thread runs no Python (gloo's worker
    and transport threads, OpenMP's): the line says so and names the main thread's frame, instead
    of the first listed thread's (the heartbeat's) as the crash site (issue 31)."""
    from planner.executor.faults import native_crash_site

    log = tmp_path / "rank-4.log"
    log.write_text(
        "step output\nFatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f55297146c0 (most recent call first):\n"
        '  File "/x/planner/executor/faults.py", line 140 in loop\n'
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n\n'
        "Thread 0x00007f554b83db80 (most recent call first):\n"
        '  File "/x/torch/distributed/_functional_collectives.py", line 140 in wait_tensor\n'
        '  File "/x/planner/executor/worker.py", line 300 in train\n\n'
        "Extension modules: torch._C (total: 1)\n"
    )
    assert native_crash_site(log) == (
        "a thread without Python frames (main thread in wait_tensor (_functional_collectives.py:140))"
    )
    log.write_text(
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f55297146c0 (most recent call first):\n"
        '  File "/x/planner/executor/faults.py", line 140 in loop\n\n'
        "Current thread 0x00007f554b83db80 (most recent call first):\n"
        '  File "/x/planner/executor/faults.py", line 173 in inject_fault\n'
    )
    assert native_crash_site(log) == "inject_fault (faults.py:173)"
    log.write_text("no dump here\n")
    assert native_crash_site(log) is None
