"""A user's `package.module:factory` can neither crash nor hang the CLI (planner.usercode): every
failure is one line naming the user's file and line, --traceback shows the trace, and a time limit
stops code that never returns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError

runner = CliRunner()
FACTORIES = Path(__file__).parent / "fixtures" / "factories.py"
REPO = Path(__file__).resolve().parent.parent


def _line_of(text: str, path: Path = FACTORIES) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert (
        len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    ), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "factory,stage,exception,marker,function",
    [
        (
            "raises_in_factory",
            "the factory failed",
            "KeyError: 'hidden_size'",
            'return config["hidden_size"]',
            "_lookup_width",
        ),
        (
            "raises_in_forward",
            "its forward/backward on the meta device failed",
            "KeyError: 'logits'",
            '["logits"]',
            "forward",
        ),
        (
            "exits_in_factory",
            "the factory failed",
            "SystemExit: it called sys.exit(3)",
            "raise SystemExit(3)",
            "exits_in_factory",
        ),
        (
            "shape_bug",
            "its forward/backward on the meta device failed",
            "RuntimeError: a and b must have same",
            "return self.proj(self.emb(tokens))",
            "forward",
        ),
    ],
)
def test_an_exception_in_the_users_code_names_its_file_and_line(
    factory, stage, exception, marker, function
):
    line = _one_line(runner.invoke(app, ["profile", f"tests.fixtures.factories:{factory}"]))
    assert f"{stage} ({exception}" in line
    assert f"at {FACTORIES.resolve()}:{_line_of(marker)} in {function}" in line


def test_every_command_that_takes_a_model_reports_it_the_same_way():
    arg = "tests.fixtures.factories:raises_in_factory"
    for argv in (
        ["profile", arg],
        ["estimate", arg, "--hardware", "p4d.24xlarge", "--gpus", "8", "--dp", "8"],
        ["recommend", arg, "--hardware", "p4d.24xlarge", "--gpus", "8"],
    ):
        line = _one_line(runner.invoke(app, argv))
        assert "the factory failed (KeyError: 'hidden_size')" in line and "factories.py" in line


def _module(tmp_path, monkeypatch, source: str) -> str:
    """A fresh module (unique name: nothing cached in sys.modules) on sys.path; returns its name."""
    name = f"usermod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize(
    "source,exception,line_no",
    [
        ("import torch\n\nWIDTH = 1 / 0\n", "ZeroDivisionError: division by zero", 3),
        (
            "import torch\nimport no_such_dependency_of_the_model\n",
            "ModuleNotFoundError: No module named 'no_such_dependency_of_the_model'",
            2,
        ),
        ("def build(:\n    pass\n", "SyntaxError: invalid syntax", 1),
    ],
)
def test_a_module_that_fails_to_import_names_its_file_and_line(
    tmp_path, monkeypatch, source, exception, line_no
):
    name = _module(tmp_path, monkeypatch, source)
    line = _one_line(runner.invoke(app, ["profile", f"{name}:build"]))
    assert f"importing {name} failed ({exception}" in line
    assert f"{tmp_path / (name + '.py')}:{line_no}" in line


def test_a_module_that_does_not_exist_is_still_named_as_missing():
    line = _one_line(runner.invoke(app, ["profile", "no_such_package_xyz.models:build"]))
    assert "'no_such_package_xyz' was not found" in line


def test_traceback_option_prints_the_users_trace_anywhere_on_the_line():
    for argv in (
        ["--traceback", "profile", "tests.fixtures.factories:raises_in_factory"],
        ["profile", "tests.fixtures.factories:raises_in_factory", "--traceback"],
    ):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2
        err = result.stderr
        assert (
            err.startswith("Traceback (most recent call last):")
            and "KeyError: 'hidden_size'" in err
        )
        assert f"line {_line_of('return config[')}, in _lookup_width" in err
        assert err.strip().splitlines()[-1].startswith("error: MODEL=")


def test_traceback_for_an_ordinary_error_and_through_the_environment(monkeypatch):
    monkeypatch.setenv("PLANNER_TRACEBACK", "1")
    result = runner.invoke(
        app, ["estimate", "gpt2", "--hardware", "p4d.24xlarge", "--gpus", "8", "--dp", "3"]
    )
    assert (
        result.exit_code == 2
        and "Traceback" in result.stderr
        and "check_world_size" in result.stderr
    )
    monkeypatch.delenv("PLANNER_TRACEBACK")
    result = runner.invoke(
        app, ["estimate", "gpt2", "--hardware", "p4d.24xlarge", "--gpus", "8", "--dp", "3"]
    )
    assert result.exit_code == 2 and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_bad_time_limits_are_one_line(value, monkeypatch):
    line = _one_line(runner.invoke(app, ["--profile-timeout-s", value, "profile", "gpt2"]))
    assert "--profile-timeout-s" in line and "positive number of seconds" in line
    monkeypatch.setenv("PLANNER_PROFILE_TIMEOUT_S", value)
    line = _one_line(runner.invoke(app, ["profile", "gpt2"]))
    assert "PLANNER_PROFILE_TIMEOUT_S" in line and "positive number of seconds" in line


def _planner(argv, cwd=REPO, env=None, limit_s=60):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=limit_s,
    )
    return proc, time.monotonic() - start


@pytest.mark.parametrize(
    "argv,stage,markers",
    [
        (
            ["profile", "tests.fixtures.factories:hangs_in_factory", "--profile-timeout-s", "2"],
            "the factory",
            ("time.sleep(0.05)", "while True:  "),
        ),
        pytest.param(
            [
                "estimate",
                "tests.fixtures.factories:hangs_in_forward",
                "--hardware",
                "p4d.24xlarge",
                "--gpus",
                "8",
                "--profile-timeout-s=15",
            ],
            "its forward/backward on the meta device",
            ("steps += 1", "while steps >= 0"),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_code_that_never_returns_is_stopped_and_located(argv, stage, markers):
    proc, seconds = _planner(argv)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    # (the forward case gets 15 s: importing torch and building the model while other test workers
    # launch executor ranks on the same two cores took over 6 s once)
    assert f"{stage} did not return within {argv[-1].split('=')[-1]} s" in lines[0]
    # stopped inside the loop: on either of its lines
    assert (
        any(f"factories.py:{_line_of(m)} in " in lines[0] for m in markers)
        and "--profile-timeout-s" in lines[0]
    )
    assert seconds < 30


@pytest.mark.slow
def test_a_module_that_hangs_while_importing_is_stopped(tmp_path):
    (tmp_path / "slowmod.py").write_text("import threading\n\nthreading.Event().wait()\n")
    proc, _ = _planner(
        ["profile", "slowmod:build"],
        cwd=tmp_path,
        env={"PLANNER_PROFILE_TIMEOUT_S": "2", "PYTHONPATH": str(REPO)},
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "importing slowmod did not return within 2 s" in lines[0] and "slowmod.py:3" in lines[0]


def test_the_time_limit_restores_an_outer_timer_and_handler():
    # pytest-timeout and the user's own code may rely on SIGALRM: the guard puts both back
    from planner.module_profiler import profile_module

    def outer(signum, frame):
        raise AssertionError("outer timer fired")

    previous = signal.signal(signal.SIGALRM, outer)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        profile_module("tests.fixtures.factories:small_gpt", micro_batch=1, precision="fp32")
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 100.0 and signal.getsignal(signal.SIGALRM) is outer
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_library_caller_gets_the_error_with_the_trace():
    from planner.module_profiler import profile_module
    from planner.usercode import UserCodeError

    with pytest.raises(UserCodeError) as err:
        profile_module("tests.fixtures.factories:raises_in_forward")
    assert isinstance(err.value, ConfigError) and "KeyError: 'logits'" in err.value.trace
