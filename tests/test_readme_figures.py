"""The README's accuracy figures are the ones the benchmark last wrote: the published-runs row of
its "How accurate, how fast" table is read and compared with benchmarks/results/accuracy_frameworks.json
(written by `benchmarks/accuracy_frameworks.py --loo`), so a rerun that moves a figure fails here
until the README says it."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "accuracy_frameworks.json"
COMMAND = "`.venv/bin/python benchmarks/accuracy_frameworks.py --loo`"


def _readme_row() -> str:
    return next(line for line in (ROOT / "README.md").read_text().splitlines() if COMMAND in line)


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def test_the_readme_states_the_last_measured_mape_of_each_stack_and_band():
    row = _readme_row()
    results = json.loads(RESULTS.read_text())
    for stack, fit in results["in_sample"]["framework"].items():
        held_out = results["leave_one_source_out"]["framework"][stack]
        assert f"{stack} {_pct(fit['mape'])} / {_pct(held_out['mape'])}" in row, stack
    for band in ("<= 512", "513-4,096"):
        fit = results["scale_bands"][f"megatron {band}"]
        assert f"{band}: {_pct(fit['mape'])} / {_pct(fit['loo_mape'])}" in row, band
    runs = sum(f["predicted"] for f in results["in_sample"]["framework"].values())
    assert re.search(rf"\| {runs} published runs", row), runs
