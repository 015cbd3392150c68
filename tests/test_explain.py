"""`planner explain`: time and memory shares add up, runners-up are compared term by term."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.explain import compare, config_differences, describe_config, explain_document

EXAMPLE = Path(__file__).parent / "data" / "plan_example.json"
runner = CliRunner()


def with_runner_up() -> dict:
    doc = json.loads(EXAMPLE.read_text())
    alt_plan = dict(doc["plan"], tp=4, dp=24, sequence_parallel=False)
    doc["alternatives"] = [
        {
            "plan": alt_plan,
            "step_time_s": 33.55,
            "peak_bytes_per_gpu": 36_000_000_000,
            "fits": True,
            "time_breakdown_s": {
                "compute": 25.0,
                "tp_comm": 1.0,
                "dp_comm": 4.5,
                "pp_p2p": 0.45,
                "bubble": 2.6,
            },
            "memory": {"peak_bytes_per_gpu": 36_000_000_000, "fits": True},
        }
    ]
    doc["search"] = {
        "objective": "throughput",
        "candidates_evaluated": 1234,
        "feasible": 99,
        "seconds": 0.5,
    }
    return doc


def test_time_and_memory_shares():
    ex = explain_document(json.loads(EXAMPLE.read_text()))
    compute = next(line for line in ex.time_lines if "compute" in line)
    assert "25.000 s" in compute and "82.0%" in compute  # 25 / 30.5
    assert any("fits" in line and "headroom" in line for line in ex.memory_lines)
    assert "no runners-up" in ex.versus_lines[0]


def test_runner_up_gap_is_split_by_term():
    doc = with_runner_up()
    lines = compare(doc, doc["alternatives"][0])
    text = "\n".join(lines)
    assert "slower by 10.0%" in text  # 33.55 / 30.5
    assert "dp_comm +4.000 s" in text and "tp_comm -2.000 s" in text
    assert "tp 8->4" in text and "dp 12->24" in text


def test_config_differences_and_description():
    a = json.loads(EXAMPLE.read_text())["plan"]
    assert config_differences(a, a) == []
    assert config_differences(a, dict(a, zero=3)) == ["zero 1->3"]
    text = describe_config(a)
    assert (
        text.startswith("dp=12 tp=8 pp=10")
        and "interleaved-1f1b(v=2)" in text
        and "stages=uneven" in text
    )


def test_cli_explain_prints_the_three_parts(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(with_runner_up()))
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 0, result.output
    for part in (
        "Where the step time goes",
        "Where the memory goes",
        "Why this plan won",
        "#2",
        "searched 1,234 candidates",
    ):
        assert part in result.stdout


def test_a_plan_that_a_fitting_runner_up_beats_is_not_said_to_have_won():
    """The plan file's own step time (30.5 s) against a faster plan that fits: the comparison says
    how many
    compared plans beat it, never "Why this plan won"."""
    doc = with_runner_up()
    step = doc["prediction"]["step_time_s"]
    doc["alternatives"][0]["step_time_s"] = step * 0.59
    text = explain_document(doc).text()
    assert "Why this plan won" not in text
    assert (
        "This plan did not win: 1 of the compared plans is faster (the best by 41% of the "
        "step):" in text
    )
    alt = doc["alternatives"][0]
    alt["fits"] = alt["memory"]["fits"] = False  # faster, but does not fit
    assert "Why this plan won:" in explain_document(doc).text()


def test_cli_explain_json(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(with_runner_up()))
    result = runner.invoke(app, ["explain", str(path), "--json"])
    data = json.loads(result.stdout)
    assert data["alternatives"][0]["slower_by"] == pytest.approx(0.1)


@pytest.mark.parametrize("content", ['{"schema_version": "2", "model": {}}', "not json", "[]"])
def test_cli_explain_rejects_bad_files_with_exit_2(content, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(content)
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_explain_search_compares_with_a_fresh_search(tmp_path):
    """A plan from `estimate` (no runners-up): --search finds what beats it."""

    from planner.estimate import estimate
    from planner.parallel import ParallelConfig
    from planner.sources import resolve_model

    cfg = ParallelConfig(
        dp=8,
        tp=1,
        pp=1,
        micro_batch=1,
        global_batch=16,
        recompute="full",
        seq=1024,
        precision="amp-fp16",
    )
    doc = estimate(resolve_model("gpt2-medium", seq=1024), "p3.16xlarge", cfg, gpus=8).to_document()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["explain", str(path), "--search"])
    assert result.exit_code == 0, result.output
    assert "#2" in result.stdout and "faster by" in result.stdout
    assert "Why this plan won" not in result.stdout and "This plan did not win" in result.stdout


def test_every_time_term_a_plan_can_have_is_explained_in_explain_and_the_docs():
    """host_wait and recompute_part_of_compute were explained nowhere (issue 30): every term the
    estimator writes
    has a definition, printed by explain, and a row in docs/cost-model.md."""
    from planner.explain import TIME_TERMS
    from planner.score import Scores

    terms = set(Scores.BREAKDOWN) | {"recompute_part_of_compute"}
    assert terms <= set(TIME_TERMS)
    doc = json.loads(EXAMPLE.read_text())
    doc["prediction"]["time_breakdown_s"]["host_wait"] = 0.5
    text = explain_document(doc).text()
    assert "What the terms measure:" in text
    assert "host_wait: time the device waits for the host" in text
    assert max(len(line) for line in explain_document(doc).term_lines) <= 100
    docs = (Path(__file__).parents[1] / "docs" / "cost-model.md").read_text()
    assert all(f"| {term} |" in docs for term in terms)


# --- explain --timeline: the simulated step as a figure -------------------------------------------

EXPOSED_RED = "#c44e52"


def test_explain_timeline_draws_the_step_and_leaves_the_plan_alone(tmp_path):
    from planner.report import backend

    plan = tmp_path / "plan.json"
    plan.write_bytes(EXAMPLE.read_bytes())
    figure = tmp_path / "step.svg"
    result = runner.invoke(app, ["explain", str(plan), "--timeline", str(figure)])
    assert result.exit_code == 0, result.output
    assert plan.read_bytes() == EXAMPLE.read_bytes()
    svg = figure.read_text()
    assert "<svg" in svg
    step = backend.step_timeline(json.loads(EXAMPLE.read_text()))
    assert len(step.ranks) == json.loads(EXAMPLE.read_text())["plan"]["pp"]
    exposed = any(r.dp_exposed_s > 0 for r in step.ranks)
    assert (EXPOSED_RED in svg) == exposed


@pytest.mark.parametrize("name", ["step.txt", "step"])
def test_explain_timeline_refuses_a_format_it_cannot_draw(tmp_path, name):
    plan = tmp_path / "plan.json"
    plan.write_bytes(EXAMPLE.read_bytes())
    result = runner.invoke(app, ["explain", str(plan), "--timeline", str(tmp_path / name)])
    assert result.exit_code == 2
    assert ".png or .svg" in result.output and "Traceback" not in result.output
    assert not (tmp_path / name).exists()


def test_explain_timeline_never_writes_over_the_plan_it_reads(tmp_path):
    plan = tmp_path / "plan.svg"  # a plan file with a figure's name
    plan.write_bytes(EXAMPLE.read_bytes())
    result = runner.invoke(app, ["explain", str(plan), "--timeline", str(plan)])
    assert result.exit_code == 2 and "plan file" in result.output
    assert plan.read_bytes() == EXAMPLE.read_bytes()
