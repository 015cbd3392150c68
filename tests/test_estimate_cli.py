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
    res = run(
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "8",
        "--global-batch",
        "64",
        "--recompute",
        "selective",
        "--sequence-parallel",
        "--virtual-stages",
        "3",
        "--json",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["plan"]["schedule"] == "interleaved-1f1b" and doc["plan"]["virtual_stages"] == 3
    assert doc["prediction"]["memory"]["fits"] is True


def test_nodes_is_an_alternative_to_gpus():
    a = json.loads(
        run("--nodes", "8", "--tp", "8", "--pp", "8", "--global-batch", "64", "--json").stdout
    )
    b = json.loads(
        run("--gpus", "64", "--tp", "8", "--pp", "8", "--global-batch", "64", "--json").stdout
    )
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
    _one_line_error(
        runner.invoke(
            app, ["estimate", "gpt3-175b", "--hardware", str(broken), "--gpus", "8", "--dp", "8"]
        ),
        "broken.json",
    )
    _one_line_error(run("--dp", "8"), "gpus")
    _one_line_error(run("--gpus", "8", "--dp", "8", "--recompute", "most"), "recompute")
    _one_line_error(run("--gpus", "8", "--dp", "8", "--impl", "jax"), "impl")
    _one_line_error(run("--gpus", "16", "--tp", "8", "--pp", "2", "--stages", "40,40"), "stages")
    _one_line_error(run("--gpus", "16", "--tp", "8", "--pp", "2", "--stages", "a,b"), "stages")
    _one_line_error(
        runner.invoke(
            app, ["estimate", "no-such-model", "--hardware", "dgx-a100-80g", "--gpus", "8"]
        ),
        "MODEL",
    )


def test_uneven_stages_flag():
    res = run(
        "--gpus",
        "16",
        "--tp",
        "8",
        "--pp",
        "2",
        "--global-batch",
        "16",
        "--stages",
        "50,46",
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["plan"]["stages"] == [50, 46]


GPT2_CONFIG = str(
    __import__("pathlib").Path(__file__).parent.parent
    / "validation"
    / "hf_configs"
    / "gpt2-medium.json"
)
H100_STEP = (
    "--hardware",
    "dgx-h100",
    "--gpus",
    "1",
    "--micro-batch",
    "8",
    "--seq",
    "1024",
    "--global-batch",
    "8",
)


def cli(*args):
    return runner.invoke(app, list(args))


def test_a_hugging_face_config_sets_dropout_and_the_framework_and_says_so():
    """GPT-2 trains with dropout 0.1 (resid/embd/attn_pdrop): on by default and marked "from config"; a config.json
    defaults to the fsdp stack (its modules run as written); flags override both."""
    text = cli("estimate", GPT2_CONFIG, *H100_STEP)
    assert text.exit_code == 0, text.output
    assert "dropout on (from config)" in text.output and "software: fsdp" in text.output
    assert "needed" in text.output and "margin" in text.output
    doc = json.loads(cli("estimate", GPT2_CONFIG, *H100_STEP, "--json").stdout)
    assert doc["software"]["dropout"] is True and doc["software"]["from_config"] == ["dropout"]
    assert doc["plan"]["framework"] == "fsdp"
    off = json.loads(
        cli(
            "estimate", GPT2_CONFIG, *H100_STEP, "--no-dropout", "--framework", "megatron", "--json"
        ).stdout
    )
    assert off["software"]["dropout"] is False and off["software"]["from_config"] == []
    assert off["plan"]["framework"] == "megatron"
    assert off["prediction"]["step_time_s"] < doc["prediction"]["step_time_s"]


def test_the_step_carries_its_measured_error_dense_or_mixture_of_experts():
    from benchmarks import model_error

    moe_runs = json.loads(model_error.MOE_ACCURACY.read_text())
    small = [abs(r["loo_error"]) for r in moe_runs["rows"] if r["gpus"] <= 512]
    dense = json.loads(run("--gpus", "64", "--tp", "8", "--pp", "8", "--json").stdout)
    args = ["estimate", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--gpus", "16", "--ep", "8"]
    sparse = json.loads(runner.invoke(app, [*args, "--dp", "16", "--json"]).stdout)
    step, band = sparse["prediction"]["step_time_s"], sparse["prediction"]["uncertainty"]
    assert abs(band["mape"] - sum(small) / len(small)) < 1e-3  # the recorded MoE runs' error
    assert band["step_time_s"] == [step * (1 - band["mape"]), step * (1 + band["mape"])]
    assert "accuracy_moe" in band["source"]
    assert "accuracy_frameworks" in dense["prediction"]["uncertainty"]["source"]
    assert dense["prediction"]["uncertainty"]["mape"] < band["mape"]
    human = runner.invoke(app, [*args, "--dp", "16"])
    assert f"+-{band['mape'] * 100:.1f}%" in human.stdout
