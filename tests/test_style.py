"""The house style, checked with every test run (so .ci/run checks it too): the tree is formatted by
ruff and passes its linter (pyproject.toml [tool.ruff]: line length 100, pycodestyle and pyflakes),
and the lines over 100 characters that the formatter cannot wrap (strings, docstrings, comments) do
not grow in number."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LONG_LINES = 2426
"""Lines over 100 characters in the project's Python files after formatting; may only fall."""


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]' installs it")
    return [found]


def test_the_tree_is_formatted():
    res = subprocess.run(
        [*_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_the_linter_passes():
    res = subprocess.run(
        [*_ruff(), "check", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_long_lines_do_not_grow():
    files = [
        p
        for d in (
            "planner",
            "cost_models",
            "frameworks",
            "hardware_profiles",
            "storage_profiles",
            "benchmarks",
            "scripts",
            "tests",
        )
        for p in (ROOT / d).rglob("*.py")
        if "site"
        not in p.relative_to(ROOT / d).parts[:2]  # tests/validators/site: installed frameworks
    ]
    long = sum(
        len(line) > 100 for p in files for line in p.read_text(encoding="utf-8").splitlines()
    )
    assert long <= MAX_LONG_LINES, f"{long} lines over 100 characters (at most {MAX_LONG_LINES})"
