"""The README's five-minute tour shows what the product prints: its recommend table and its explain
lines are compared with a run of the same commands, so a refit or a model change that moves them
fails here until the README says the new figures."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from planner.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"
TOUR = (
    "$ planner recommend llama3-8b --hardware p5.48xlarge --gpus 32 --framework torchtitan --top 3"
)


def _tour_block() -> list[str]:
    """The tour's console lines, from its recommend command to the block's end."""
    text = README.read_text()
    start = text.index(TOUR)
    return text[start : text.index("```", start)].splitlines()


def _plan_rows(lines: list[str]) -> list[str]:
    """The ranking table's numbered rows, whitespace-normalized."""
    return [" ".join(line.split()) for line in lines if re.match(r"^\d+\s+\d+\.\d+\.\d+", line)]


def test_the_readme_tour_prints_what_recommend_and_explain_print(tmp_path):
    tour = _tour_block()
    plan = tmp_path / "plan.json"
    argv = TOUR.removeprefix("$ planner ").split() + ["--out", str(plan)]
    recommend = CliRunner().invoke(app, argv)
    assert recommend.exit_code == 0, recommend.output
    shown = _plan_rows(tour)
    assert len(shown) == 3 and shown == _plan_rows(recommend.output.splitlines())
    band = re.search(r"fastest \(\+-([\d.]+%)", recommend.output).group(1)
    assert f"fastest (+-{band}, ...)" in "\n".join(tour)

    explain = CliRunner().invoke(app, ["explain", str(plan)])
    assert explain.exit_code == 0, explain.output
    printed = [" ".join(line.split()) for line in explain.output.splitlines()]
    shown = [" ".join(line.split()) for line in tour]
    predicted = next(line for line in printed if line.startswith("predicted "))
    assert predicted in shown
    for term in ("compute", "dp_comm"):
        line = next(line for line in printed if line.startswith(term + " "))
        assert line in shown, line
