"""The `recommend` table for people: the deciding columns within 100 characters, nothing cut off a
terminal,
placement-only twins in one row, a legend for the headers, and --help readable at 80 columns."""

import copy
import re

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.commands.plan_table import merged_rows, table_lines
from planner.search import recommend

runner = CliRunner()


@pytest.fixture(scope="module")
def docs():
    """recommend's top 5 for the issue's first repro, with prices and the time to train (the widest
    default)."""
    rec = recommend("llama3-8b", "p5.48xlarge", gpus=32, top=5, tokens=15e12)
    return [rec.best, *rec.alternatives]


def table_part(lines):
    """Header, rule and rows (the lines before the legend)."""
    return lines[: next(i for i, line in enumerate(lines) if line.startswith("legend: "))]


def test_default_table_fits_100_columns_and_keeps_every_number(docs):
    lines = table_lines(docs)
    assert max(len(line) for line in table_part(lines)) <= 100
    text = "\n".join(lines)
    for doc in docs:  # whole numbers, never an ellipsis: the step time, MFU, memory, cost and days
        pred = doc["prediction"]
        assert f"{pred['step_time_s']:.3f}" in text and f"{pred['mfu']:.1%}" in text
        assert f"{pred['memory']['peak_bytes_per_gpu'] / 2**30:.1f}" in text
        assert f"{pred['cost']['usd_per_1b_tokens']:,.0f}" in text
        assert f"{pred['reliability']['time_to_train_s'] / 86400:.1f}" in text
    assert "…" not in text


def test_the_comm_column_is_each_plans_exposed_communication(docs):
    """Issue 32 item 4: each row shows the communication its step waits for, the sum of the plan
    document's tp, cp, ep, dp and pipeline-send terms (with --wide: the default table keeps to
    100 columns)."""
    lines = table_part(table_lines(docs, wide=True))
    headers = re.split(r"\s{2,}", lines[0].strip())
    at = headers.index("comm s")
    for doc, row in zip(docs, lines[2:]):
        terms = doc["prediction"]["time_breakdown_s"]
        total = sum(terms[k] for k in ("tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_p2p"))
        assert re.split(r"\s{2,}", row.strip())[at] == f"{total:.3f}"


def test_legend_explains_every_header_shown(docs):
    lines = table_lines(docs)
    headers = re.split(r"\s{2,}", table_part(lines)[0].strip())
    legend = next(line for line in lines if line.startswith("legend: "))
    assert [h for h in headers if h != "#" and f"{h}: " not in legend] == []


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("wide", [False, True])
def test_a_terminal_narrower_than_the_table_drops_optional_columns_and_says_so(docs, width, wide):
    lines = table_lines(docs, wide=wide, width=width)
    assert max(len(line) for line in table_part(lines)) <= width
    whole = table_lines(docs, wide=wide)
    if max(len(line) for line in table_part(whole)) > width:
        assert any(f"left out at {width} columns" in line for line in lines)
    for must in ("dp.tp.pp", "step s", "GiB", "days"):  # what a plan is chosen on stays
        assert must in table_part(lines)[0]


def test_wide_adds_the_other_columns(docs):
    header = table_part(table_lines(docs, wide=True))[0]
    for name in ("tokens/s", "SP", "stages", "goodput", "comm s"):
        assert name in header
    assert "tokens/s" not in table_part(table_lines(docs))[0]


def test_placement_only_twins_share_one_row(docs):
    best = docs[0]
    other = "PDCT" if best["plan"]["placement"] != "PDCT" else "DPCT"
    twin = copy.deepcopy(best)
    twin["plan"]["placement"] = other
    rows = merged_rows([best, twin, *docs[1:]])
    assert len(rows) == len(docs) and rows[0][1] == (best["plan"]["placement"], other)
    lines = table_lines([best, twin, *docs[1:]])
    assert f"{best['plan']['placement']}|{other}" in lines[2]
    slower = copy.deepcopy(twin)
    slower["prediction"]["step_time_s"] *= 1.01  # 1% slower: not a twin
    assert len(merged_rows([best, slower])) == 2


def test_piped_recommend_prints_plain_rows_that_are_never_cut():
    result = runner.invoke(
        app, ["recommend", "llama3-8b", "--hardware", "p5.48xlarge", "--gpus", "32"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].startswith("#  dp.tp.pp") and "…" not in result.stdout
    assert any(line.startswith("legend: ") for line in lines)


@pytest.mark.parametrize(
    "command",
    [
        ["recommend"],
        ["estimate"],
        ["report"],
        ["export"],
        ["profile"],
        ["run"],
        ["explain"],
        ["hardware", "list"],
    ],
)
def test_help_is_readable_at_80_columns(command):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "…" not in result.stdout
    options = re.findall(r"^\s+(--[a-z0-9-]+)", result.stdout, flags=re.M)
    assert options and all(re.fullmatch(r"--[a-z0-9-]+", o) for o in options)


def test_cost_objective_without_a_price_is_one_line_and_exit_2_with_the_fix():
    result = runner.invoke(
        app,
        ["recommend", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "32", "--objective", "cost"],
    )
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert (
        "--objective cost" in result.stderr and "dgx-h100's profile has no price" in result.stderr
    )
    assert "pass --price-per-hour" in result.stderr
    priced = runner.invoke(
        app,
        [
            "recommend",
            "llama3-8b",
            "--hardware",
            "dgx-h100",
            "--gpus",
            "32",
            "--objective",
            "cost",
            "--price-per-hour",
            "40",
        ],
    )
    assert (
        priced.exit_code == 0
        and "priced at $40.00 per node-hour (your --price-per-hour)" in priced.stdout
    )


def test_the_output_names_the_profiles_price_and_its_source():
    from hardware_profiles import load_profile

    profile = load_profile("p5.48xlarge")
    result = runner.invoke(
        app, ["recommend", "llama3-8b", "--hardware", "p5.48xlarge", "--gpus", "32"]
    )
    assert (
        f"priced at ${profile.price_usd_per_hour:,.2f} per node-hour (p5.48xlarge on-demand price: "
        f"{profile.sources['price_usd_per_hour']})" in result.stdout
    )
