"""`planner estimate` through the CLI: JSON document, human tables, every error path (exit 2)."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
BASE = ["estimate", "gpt3-175b", "--hardware", "dgx-a100-80g"]


def run(*args):
    return runner.invoke(app, [*BASE, *args])


def test_json_document_on_stdout():
    res = run("--gpus", "64", "--tp", "8", "--pp", "8", "--global-batch", "64", "--recompute", "selective",
              "--sequence-parallel", "--virtual-stages", "3", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["plan"]["schedule"] == "interleaved-1f1b" and doc["plan"]["virtual_stages"] == 3
    assert doc["prediction"]["memory"]["fits"] is True


def test_nodes_is_an_alternative_to_gpus():
    a = json.loads(run("--nodes", "8", "--tp", "8", "--pp", "8", "--global-batch", "64", "--json").stdout)
    b = json.loads(run("--gpus", "64", "--tp", "8", "--pp", "8", "--global-batch", "64", "--json").stdout)
    assert a["prediction"]["step_time_s"] == b["prediction"]["step_time_s"]
    assert a["hardware"]["gpus"] == 64


def test_human_output_and_not_fitting_is_exit_0():
    res = run("--gpus", "8", "--dp", "8", "--global-batch", "8")
    assert res.exit_code == 0
    assert "does NOT fit" in res.output and "time per step" in res.output


def _one_line_error(res, needle):
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], res.output


def test_errors_are_one_line_exit_2(tmp_path):
    _one_line_error(run("--gpus", "64", "--tp", "8", "--pp", "4"), "world_size(64)")
    _one_line_error(run("--gpus", "40", "--tp", "5", "--pp", "8"), "tp=5")
    _one_line_error(run("--gpus", "128", "--pp", "128"), "pp=128")
    _one_line_error(run("--gpus", "8", "--dp", "8", "--hardware", "no-such-box"), "hardware")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    _one_line_error(runner.invoke(app, ["estimate", "gpt3-175b", "--hardware", str(broken), "--gpus", "8",
                                        "--dp", "8"]), "broken.json")
    _one_line_error(run("--dp", "8"), "gpus")
    _one_line_error(run("--gpus", "8", "--dp", "8", "--recompute", "most"), "recompute")
    _one_line_error(run("--gpus", "8", "--dp", "8", "--impl", "jax"), "impl")
    _one_line_error(run("--gpus", "16", "--tp", "8", "--pp", "2", "--stages", "40,40"), "stages")
    _one_line_error(run("--gpus", "16", "--tp", "8", "--pp", "2", "--stages", "a,b"), "stages")
    _one_line_error(runner.invoke(app, ["estimate", "no-such-model", "--hardware", "dgx-a100-80g", "--gpus", "8"]),
                    "MODEL")


def test_uneven_stages_flag():
    res = run("--gpus", "16", "--tp", "8", "--pp", "2", "--global-batch", "16", "--stages", "50,46", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["plan"]["stages"] == [50, 46]
