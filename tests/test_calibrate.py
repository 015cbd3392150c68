"""Calibration: the fits recover known parameters, and a real (tiny) run yields a loadable profile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hardware_profiles import load_profile
from planner.calibrate import (
    bus_factor,
    collective_seconds,
    efficiency_from_fits,
    fit_alpha_beta,
    fit_gemm,
    latency_steps,
)
from planner.cli import app
from tests.fixtures.processes import alive as _alive, children as _children

runner = CliRunner()
SIZES = np.array([2.0**p for p in range(10, 27, 2)])


def test_nccl_tests_bus_factors():
    """nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, allgather and reducescatter (n-1)/n."""
    assert bus_factor("allreduce", 8) == pytest.approx(14 / 8)
    assert bus_factor("allgather", 8) == bus_factor("reducescatter", 8) == pytest.approx(7 / 8)
    assert bus_factor("p2p", 8) == 1.0
    # all-reduce: ring 2(n-1) = 6 or tree 2 log2 n = 4 at n = 4, 14 or 6 at n = 8; ring n-1 else
    assert latency_steps("allreduce", 4) == 4 and latency_steps("allreduce", 8) == 6
    assert latency_steps("allreduce", 2) == 2 and latency_steps("allgather", 4) == 3


def test_allreduce_time_by_hand():
    # n=4, 1 GB, 10 us/step, 100 GB/s bus: 4 (tree) * 10us + 1.5 * 1e9 / 1e11 = 40us + 15 ms
    t = collective_seconds("allreduce", 4, 1e9, 10e-6, 100e9)
    assert float(t) == pytest.approx(40e-6 + 15e-3)


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter", "p2p"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_fit_recovers_alpha_and_beta_exactly_from_model_timings(collective, world_size):
    alpha_s, busbw = 25e-6, 3.2e9
    times = collective_seconds(collective, world_size, SIZES, alpha_s, busbw)
    fit = fit_alpha_beta(collective, world_size, SIZES, times)
    assert fit.alpha_us == pytest.approx(25.0, rel=1e-4)
    assert fit.busbw_GBps == pytest.approx(3.2, rel=1e-4)
    assert fit.rms_rel_error < 1e-6


def test_fit_recovers_parameters_through_noise_and_an_outlier():
    rng = np.random.default_rng(0)
    alpha_s, busbw = 150e-6, 1.5e9
    times = collective_seconds("allreduce", 4, SIZES, alpha_s, busbw) * rng.lognormal(
        0.0, 0.03, SIZES.size
    )
    times[3] *= 4.0  # one descheduled sample, as on a shared machine
    fit = fit_alpha_beta("allreduce", 4, SIZES, times)
    assert fit.alpha_us == pytest.approx(150.0, rel=0.10)
    assert fit.busbw_GBps == pytest.approx(1.5, rel=0.10)


def test_gemm_fit_recovers_rate_and_overhead():
    flops = np.array([2.0 * n**3 for n in (64, 128, 256, 512, 1024, 2048)])
    rate, overhead_s = 40e9, 30e-6
    fit = fit_gemm("fp32", flops, overhead_s + flops / rate)
    assert fit.rate_tflops == pytest.approx(0.040, rel=1e-4)
    assert fit.overhead_us == pytest.approx(30.0, rel=1e-3)
    assert float(fit.efficiency(fit.half_efficiency_flops)) == pytest.approx(0.5)
    assert fit.best_measured_tflops < fit.rate_tflops


def test_fit_needs_two_points():
    with pytest.raises(ValueError):
        fit_alpha_beta("allreduce", 2, [1024], [1e-4])


def test_world_size_one_is_rejected():
    result = runner.invoke(app, ["hardware", "calibrate", "--gpus", "1", "--quick"])
    assert result.exit_code == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_quick_calibration_with_two_ranks_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "here.json"
    previous = json.loads(
        (Path(__file__).resolve().parents[1] / "hardware_profiles" / "cpu-local.json").read_text()
    )
    previous["efficiency"]["overlap_interference"] = 0.5
    out.write_text(json.dumps(previous))
    result = runner.invoke(
        app,
        ["hardware", "calibrate", "--out", str(out), "--gpus", "2", "--quick", "--name", "here"],
    )
    assert result.exit_code == 0, result.output
    profile = load_profile(str(out))
    assert profile.name == "here" and profile.devices_per_node == 2
    assert (
        profile.efficiency["overlap_interference"] == 0.5
    )  # other owners' keys survive a recalibration
    # measured unless the loaded host left even the largest --quick message latency-bound (then the
    # profile keeps its previous value or the table's default: efficiency_from_fits)
    measured = profile.efficiency.get("allreduce_bus_efficiency")
    assert measured is None or 0 < measured <= 16
    cal = profile.calibration
    assert set(cal["collectives"]) == {"allreduce", "allgather", "reducescatter", "p2p"}
    for fit in cal["collectives"].values():
        assert fit["alpha_us"] >= 0 and fit["busbw_GBps"] > 0 and fit["points"] == 3
    assert profile.peak_tflops["fp32"] > 0 and profile.memory_bandwidth_GBps > 0
    assert "--gpus 2 --quick" in cal["command"]


def test_sizes_too_small_to_see_bandwidth_are_flagged_not_absurd():
    sizes = np.array([64.0, 128.0, 256.0])
    fit = fit_alpha_beta("reducescatter", 2, sizes, np.full(3, 1e-3))  # flat: latency only
    assert fit.busbw_GBps <= 1e4 and fit.bandwidth_share_at_max < 0.01
    assert fit.alpha_us == pytest.approx(1000.0, rel=1e-3)


def _synthetic_measurement(world_size: int) -> dict:
    """What run_measurements returns, generated from known parameters (no processes)."""
    sizes = [float(2**p) for p in range(10, 27, 2)]
    truth = {
        "allreduce": (800e-6, 0.5e9),
        "allgather": (900e-6, 0.4e9),
        "reducescatter": (1000e-6, 0.2e9),
        "p2p": (200e-6, 1.0e9),
    }
    colls = {
        c: [[s, float(collective_seconds(c, world_size, s, a, b))] for s in sizes]
        for c, (a, b) in truth.items()
    }
    gemm = {
        "fp32": [[n, n, n, 70e-6 + 2.0 * n**3 / 4e9] for n in (64, 128, 256, 512, 1024)],
        "bf16": [[n, n, n, 2.0 * n**3 / 0.25e9] for n in (64, 128, 256)],
    }
    return {
        "world_size": world_size,
        "backend": "gloo",
        "quick": False,
        "gemm": gemm,
        "copy": {"bytes_moved": 2 << 28, "seconds": 0.25},
        "collectives": colls,
    }


def test_profile_written_by_calibrate_makes_the_cost_model_reproduce_the_fits():
    """The keys calibrate writes feed the cost model's formulas (docs/cost-model.md) so that they give
    back the fitted times: all-reduce over 2 ranks (ring = tree there) and fp32 GEMMs."""
    from cost_models.comm import group_collective_seconds
    from cost_models.compute import gemm_seconds
    from hardware_profiles.loader import profile_from_dict
    from planner.calibrate import build_profile

    doc = build_profile(
        _synthetic_measurement(2),
        name="synthetic",
        command="test",
        previous={"efficiency": {"dispatch_us_per_op": 5.0}},
    )
    hw = profile_from_dict(doc)
    assert hw.efficiency["dispatch_us_per_op"] == 5.0
    for size in (1e3, 1e6, 1e8):
        expected = float(collective_seconds("allreduce", 2, size, 800e-6, 0.5e9))
        assert float(group_collective_seconds("allreduce", size, 2, 2, hw)) == pytest.approx(
            expected, rel=1e-3
        )
    n = 1024
    assert float(gemm_seconds(n, n, n, hw=hw, precision="fp32")) == pytest.approx(
        70e-6 + 2.0 * n**3 / 4e9, rel=1e-3
    )


@pytest.mark.parametrize("world_size", [4, 8])
def test_calibrated_profile_gives_back_measured_small_allreduces(world_size):
    """Whatever algorithm the backend ran, the cost model must give back the all-reduce times the
    calibration measured. Here they come from a ring (gloo's algorithm: 2(n-1) latency steps of
    800 us, 0.5 GB/s bus) while the cost model charges the fewer of ring and tree steps; fitting
    alpha with ring steps left a 4- or 8-rank profile's small all-reduces 1/3 to 4/7 too cheap."""
    from cost_models.comm import group_collective_seconds
    from hardware_profiles.loader import profile_from_dict
    from planner.calibrate import build_profile

    measured = _synthetic_measurement(world_size)
    ring = [
        [s, 2 * (world_size - 1) * 800e-6 + bus_factor("allreduce", world_size) * s / 0.5e9]
        for s in (float(2**p) for p in range(10, 27, 2))
    ]
    measured["collectives"]["allreduce"] = ring
    hw = profile_from_dict(build_profile(measured, name="synthetic", command="test"))
    for size, seconds in ring[:3]:  # the latency-bound sizes, 1-16 KiB
        model = float(group_collective_seconds("allreduce", size, world_size, world_size, hw))
        assert model == pytest.approx(seconds, rel=0.02)


def test_calibrating_over_a_refining_profile_keeps_the_keys_it_inherited(tmp_path):
    """A user's file that `refines` dgx-h100 (docs/guide.md) holds only its own efficiency keys;
    calibrating over it keeps every key it inherited from that profile's file, not only its own,
    and writes a profile that stands alone."""
    import json

    from hardware_profiles.loader import PROFILE_DIR, previous_profile, profile_from_dict
    from planner.calibrate import build_profile

    shipped = json.loads((PROFILE_DIR / "dgx-h100.json").read_text())
    mine = json.loads((PROFILE_DIR / "p5.48xlarge.json").read_text())
    mine.update(name="mine", refines="dgx-h100", efficiency={"allreduce_bus_efficiency": 0.7})
    mine["sources"]["efficiency"] = "allreduce_bus_efficiency 0.7: measured on my cluster"
    out = tmp_path / "mine.json"
    out.write_text(json.dumps(mine))
    previous = previous_profile(out)
    doc = build_profile(_synthetic_measurement(2), name="mine", command="test", previous=previous)
    kept = set(shipped["efficiency"]) - set(doc["efficiency"])
    assert "refines" not in doc and not kept, sorted(kept)
    assert (
        profile_from_dict(doc).efficiency["flash_attention_efficiency"]
        == (shipped["efficiency"]["flash_attention_efficiency"])
    )


def test_latency_bound_fit_does_not_overwrite_a_bus_efficiency():
    sizes = np.array([64.0, 128.0, 256.0])
    flat = fit_alpha_beta("reducescatter", 2, sizes, np.full(3, 1e-3))
    p2p = fit_alpha_beta(
        "p2p", 2, np.array([1e3, 1e5, 1e7]), 1e-5 + np.array([1e3, 1e5, 1e7]) / 1e9
    )
    seen = fit_alpha_beta(
        "allreduce", 2, np.array([1e3, 1e5, 1e7]), 1e-5 + np.array([1e3, 1e5, 1e7]) / 1e9
    )
    eff = efficiency_from_fits(
        {"collectives": {"p2p": p2p, "reducescatter": flat, "allreduce": seen}, "gemm": {}}, {}
    )
    assert "reducescatter_bus_efficiency" not in eff
    assert 0 < eff["allreduce_bus_efficiency"] <= 16


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.slow
@pytest.mark.parametrize("sig_name", ["SIGTERM", "SIGKILL"])
def test_a_signal_to_calibrate_leaves_no_measuring_rank_behind(tmp_path, sig_name):
    """SIGTERM (timeout, Slurm, Kubernetes) stops the ranks and exits 143 with one line; SIGKILL of the
    launcher ends them too (they die with their parent)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    sig = getattr(signal, sig_name)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner",
            "hardware",
            "calibrate",
            "--gpus",
            "2",
            "--out",
            str(tmp_path / "p.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    ranks: set[int] = set()
    while time.monotonic() < deadline and launcher.poll() is None:
        ranks = {
            p
            for p in _children(launcher.pid)
            if "planner" in open(f"/proc/{p}/cmdline").read()
            or "multiprocessing" in open(f"/proc/{p}/cmdline").read()
        }
        if len(ranks) >= 2:
            break
        time.sleep(0.2)
    assert len(ranks) >= 2, launcher.communicate()
    time.sleep(2.0)  # the ranks are importing torch or measuring
    os.kill(launcher.pid, sig)
    _, err = launcher.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert launcher.returncode == 143, err
        assert (
            err.strip().splitlines()[-1]
            == "error: calibration stopped by SIGTERM: stopped all 2 ranks"
        )
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ranks if _alive(p)], "a calibration rank outlived its launcher"


def test_rewriting_a_profiles_fit_keeps_the_sources_it_does_not_own():
    """benchmarks/calibrate.py rewrites its own keys' source clauses and keeps the rest whole: a clause with a '; '
    inside (a list of papers) and the keys benchmarks/calibrate_frameworks.py writes (once dropped, which left
    shipped values without a source)."""
    from benchmarks.calibrate import foreign_clauses

    text = (
        "benchmarks/calibrate.py (docs): gemm_efficiency_max fitted; gemm_fixed_us, dispatch_us_per_op carried over; "
        "fused_attention_efficiency 0.55: FA-3 (attention.json; Shah et al. 2024, Dao 2023), not fitted; "
        "sustained_clock_fraction 0.853: fitted to published runs; gemm_wave_sms: 108 SMs"
    )
    kept = foreign_clauses(
        text, {"gemm_efficiency_max", "gemm_fixed_us", "dispatch_us_per_op", "gemm_wave_sms"}
    )
    assert kept == [
        "fused_attention_efficiency 0.55: FA-3 (attention.json; Shah et al. 2024, Dao 2023), not fitted",
        "sustained_clock_fraction 0.853: fitted to published runs",
    ]
    for name in (
        "dgx-h100",
        "dgx-a100-80g",
    ):  # every shipped key of those profiles keeps a source clause
        profile = json.loads(
            (Path(__file__).resolve().parents[1] / "hardware_profiles" / f"{name}.json").read_text()
        )
        sourced = " ".join(foreign_clauses(profile["sources"]["efficiency"], set()))
        for key in ("triton_attention_relative", "flash_attention_efficiency"):
            assert key in sourced, (name, key)


def _calibrate_cli(out, *, timeout=60):
    """`planner hardware calibrate --out OUT --quick` in its own process (as a user runs it)."""
    import subprocess
    import sys
    import time

    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "hardware",
            "calibrate",
            "--gpus",
            "2",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=lambda: __import__("resource").setrlimit(
            __import__("resource").RLIMIT_AS, (6_000_000 * 1024, 6_000_000 * 1024)
        ),
    )
    return done, time.monotonic() - t0


def _unwritable_outs(tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "array.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text('{"mine": true}')
    (tmp_path / "file").write_text("x")
    return {
        "/dev/zero": "is a character device, not a regular file",
        "/dev/full": "is a character device, not a regular file",
        str(fifo): "is a FIFO, not a regular file",
        str(tmp_path / "array.json"): "expected a JSON object, found an array",
        str(tmp_path / "other.json"): "exists and is not a hardware profile",
        str(tmp_path / "file" / "p.json"): "is not a directory",
        "/sys/p.json": "is not writable",  # root writes anywhere but here
        str(tmp_path / "missing" / "p.json"): "does not exist",
    }


@pytest.mark.timeout(300)
def test_an_out_calibrate_cannot_write_is_one_line_before_any_measurement(tmp_path):
    """Issue 31: --out /dev/full grew to 16 GB, a FIFO hung, [1, 2] or a missing folder was a traceback after the
    whole measurement. Now each is one line and exit 2 within 5 s (under a 6 GB address-space limit) and nothing
    there changes."""
    import os

    for out, needle in _unwritable_outs(tmp_path).items():
        before = (
            sorted(os.listdir(tmp_path)),
            [p.read_bytes() for p in sorted(tmp_path.glob("*.json"))],
        )
        done, seconds = _calibrate_cli(out)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], (out, done.stderr)
        assert (
            "Traceback" not in done.stderr
            and "calibrating" not in done.stderr
            and done.stdout == ""
        )
        assert seconds < 5 + 10, (out, seconds)  # 5 s, with room for a loaded test machine
        assert (
            sorted(os.listdir(tmp_path)),
            [p.read_bytes() for p in sorted(tmp_path.glob("*.json"))],
        ) == before


def _start_calibration(tmp_path):
    import subprocess
    import sys
    import time

    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, runpy; signal.signal(signal.SIGINT, "
            "signal.SIG_DFL); runpy.run_module('planner', run_name='__main__')",
            "hardware",
            "calibrate",
            "--gpus",
            "2",
            "--quick",
            "--out",
            str(tmp_path / "p.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while (
        time.monotonic() < deadline and len(_children(launcher.pid)) < 2 and launcher.poll() is None
    ):
        time.sleep(0.05)
    return launcher, _children(launcher.pid)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("wait_s", [0.2, pytest.param(2.0, marks=pytest.mark.slow)])
def test_ctrl_c_to_the_process_group_is_one_line_and_leaves_nothing(tmp_path, wait_s):
    """Issue 31: Ctrl-C (SIGINT to the whole group) printed a rank's KeyboardInterrupt traceback in 2 of 4 tries.
    Ranks start with SIGINT blocked and then ignore it; the launcher stops them and prints one line, exit 130."""
    import glob
    import os
    import signal
    import tempfile
    import time

    before = set(glob.glob(f"{tempfile.gettempdir()}/planner-calibrate-*"))
    launcher, ranks = _start_calibration(tmp_path)
    time.sleep(wait_s)  # the ranks are starting Python, or importing torch
    os.killpg(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    assert [
        line for line in err.splitlines() if "Traceback" in line or "KeyboardInterrupt" in line
    ] == []
    assert (
        err.strip().splitlines()[-1] == "error: calibration stopped by SIGINT: stopped all 2 ranks"
    )
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in ranks if _alive(p)]
    assert set(glob.glob(f"{tempfile.gettempdir()}/planner-calibrate-{launcher.pid}-*")) <= before
    assert not (tmp_path / "p.json").exists()


@pytest.mark.multiprocess
@pytest.mark.slow  # the default tier keeps the Ctrl-C case of the same cleanup
@pytest.mark.timeout(300)
def test_sigkill_while_ranks_start_leaves_no_rank_and_the_next_start_sweeps_its_folder(tmp_path):
    """Issue 31: SIGKILL while the workers start left 3 processes alive for seconds and a temporary folder. Ranks
    arm the parent-death signal before importing anything heavy; the next calibration removes the dead one's
    folder (a SIGKILL runs no clean-up code)."""
    import glob
    import os
    import signal
    import tempfile
    import time

    from planner.calibrate import sweep_temporary_dirs

    launcher, ranks = _start_calibration(tmp_path)
    time.sleep(0.3)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.communicate(timeout=30)
    deadline = time.monotonic() + 2.0
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(ranks) >= 2 and not [p for p in ranks if _alive(p)]
    left = glob.glob(f"{tempfile.gettempdir()}/planner-calibrate-{launcher.pid}-*")
    assert len(left) == 1  # what a SIGKILL leaves ...
    assert Path(left[0]) in sweep_temporary_dirs()  # ... the next calibration removes
    assert not os.path.exists(left[0])


def test_the_sweep_removes_only_folders_of_calibrations_that_are_gone(tmp_path):
    import os
    import subprocess

    dead_pid = subprocess.Popen(["true"])  # a pid that has exited
    dead_pid.wait()
    for name in (
        f"planner-calibrate-{dead_pid.pid}-abc",
        f"planner-calibrate-{os.getpid()}-abc",
        "planner-calibrate-legacy",
        "other",
    ):
        (tmp_path / name).mkdir()
    from planner.calibrate import sweep_temporary_dirs

    assert sweep_temporary_dirs(str(tmp_path)) == [
        tmp_path / f"planner-calibrate-{dead_pid.pid}-abc"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"planner-calibrate-{os.getpid()}-abc", "planner-calibrate-legacy", "other"]
    )


def test_an_out_that_can_never_be_written_is_refused_before_torch_or_the_cli_loads(tmp_path):
    """Issue 31: the --out check is the first thing `calibrate` does (planner.__main__.early_refusal),
    so its one line does not wait for planner.cli, numpy or torch to load (0.9 s of CPU, 7-20 s with
    both cores busy). The module list of `-X importtime` proves what was loaded."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out, needle in (("/dev/zero", "is a character device"), (str(fifo), "is a FIFO")):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "planner", "hardware", "calibrate"]
            + ["--out", out],
            capture_output=True,
            text=True,
            timeout=60,
        )
        loaded = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert done.returncode == 2 and len(errors) == 1 and needle in errors[0], done.stderr
        assert not {"torch", "numpy", "typer", "planner.cli", "planner.calibrate"} & loaded
