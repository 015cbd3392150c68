"""The CLI's contract with a user trying bad inputs (docs/cli-contract.md): results on stdout,
diagnostics on stderr; every bad input is one line on stderr and exit 2, never a traceback; --json
and every JSON file written are strict JSON; outputs are written whole or not at all."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from tests.fixtures.cli import one_line

runner = CliRunner()
TESTS = Path(__file__).parent
PROFILES = TESTS.parent / "hardware_profiles"
GPT2 = ["gpt2", "--hardware", "p4d.24xlarge", "--gpus", "8"]
EST = ["estimate", *GPT2, "--dp", "8"]
REC = ["recommend", *GPT2]


def _strict(text: str):
    return json.loads(
        text, parse_constant=lambda name: pytest.fail(f"{name} in strict JSON output")
    )


# ------------------------------------------------------------------------------- one line, exit 2


@pytest.mark.parametrize(
    "argv,needles",
    [
        # sizes beyond anything real: refused instead of hanging the search or overflowing
        ([*REC[:4], "--gpus", "100000000000000000000"], ["--gpus", "1048576"]),
        ([*REC, "--global-batch", "100000000000000000000"], ["--global-batch", "16777216"]),
        ([*EST, "--seq", "100000000000000000000"], ["--seq", "16777216"]),
        (["recommend", "gpt2", "--hardware", "p4d.24xlarge", "--nodes", "2000000"], ["--nodes"]),
        ([*EST, "--micro-batch", "0"], ["--micro-batch"]),
        ([*REC, "--top", "0"], ["--top"]),
        ([*REC, "--top", "101"], ["--top"]),
        (["profile", "gpt2", "--seq", "0"], ["--seq"]),
        # tokens and prices
        ([*REC, "--tokens", "1e400"], ["tokens='1e400'", "from 1 to 1e+16"]),
        ([*REC, "--tokens", "0.5"], ["tokens='0.5'"]),
        ([*REC, "--tokens", "-3B"], ["tokens='-3B'"]),
        ([*REC, "--tokens", "lots"], ["tokens='lots'"]),
        ([*REC, "--tokens", ""], ["tokens=''"]),
        ([*REC, "--price-per-hour", "nan"], ["price-per-hour=nan"]),
        ([*REC, "--price-per-hour", "0"], ["price-per-hour=0"]),
        ([*REC, "--price-per-hour", "1e308"], ["price-per-hour=1e+308", "at most 10000"]),
        (["report", *GPT2, "--tokens", "inf", "--out", "unused"], ["tokens='inf'"]),
        (["report", *GPT2, "--tokens", "nan", "--out", "unused"], ["tokens='nan'"]),
        (
            ["report", *GPT2, "--scaling-nodes", "1000000000", "--out", "unused"],
            ["--scaling-nodes"],
        ),
        (
            ["report", *GPT2, "--scaling-nodes", ",".join(["1"] * 33), "--out", "unused"],
            ["--scaling-nodes"],
        ),
        (["report", *GPT2, "--scaling-nodes", "1,x", "--out", "unused"], ["--scaling-nodes='1,x'"]),
        # names and formats
        (["estimate", "", "--hardware", "p4d.24xlarge", "--gpus", "8"], ["MODEL=''"]),
        (["estimate", ":", "--hardware", "p4d.24xlarge", "--gpus", "8"], ["MODEL=':'"]),
        (["estimate", "gpt2", "--hardware", "", "--gpus", "8"], ["hardware=''"]),
        ([*EST, "--schedule", "pipedream"], ["schedule='pipedream'"]),
        ([*EST, "--placement", "dpt"], ["placement='dpt'"]),
        ([*EST, "--framework", "jax"], ["framework='jax'"]),
        ([*EST, "--fp8-scaling", "colwise"], ["fp8_scaling='colwise'", "tensorwise, rowwise"]),
        ([*REC, "--fp8-scaling", "colwise"], ["fp8_scaling='colwise'", "tensorwise, rowwise"]),
        ([*EST, "--loss", "chunked"], ["loss='chunked'", "inplace"]),
        ([*REC, "--loss", "chunked"], ["loss='chunked'", "inplace"]),
        ([*EST, "--activation-fp8-input"], ["activation_fp8_input", "SwiGLU"]),
        ([*REC, "--activation-fp8-input"], ["activation_fp8_input", "SwiGLU"]),
        (
            [
                "estimate",
                "llama3-8b",
                "--hardware",
                "p5.48xlarge",
                "--gpus",
                "8",
                "--dp",
                "8",
                "--framework",
                "fsdp",
                "--activation-fp8-input",
            ],
            ["fsdp cannot run this plan: activation_fp8_input"],
        ),
        ([*EST, "--stages", ","], ["stages=','"]),
        ([*EST, "--precision", "fp4"], ["fp4"]),
        ([*REC, "--objective", "speed"], ["objective='speed'"]),
        (["profile", "gpt2", "--precision", "fp4"], ["precision='fp4'"]),
        (
            ["export", str(TESTS / "data" / "plan_example.json"), "--format", "jax"],
            ["format='jax'"],
        ),
        # files that are not what they should be
        (["explain", str(TESTS)], ["plan", "Is a directory"]),
        (["estimate", "gpt2", "--hardware", str(TESTS), "--gpus", "8"], ["hardware="]),
        (["profile", str(TESTS / "missing.json")], ["no such file"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needles):
    one_line(runner.invoke(app, argv), *needles)


@pytest.mark.parametrize(
    "content", ["[" * 50_000 + "]" * 50_000, '{"a":' * 50_000 + "1" + "}" * 50_000]
)
def test_deeply_nested_json_is_one_line_for_every_reader(tmp_path, content):
    path = tmp_path / "deep.json"
    path.write_text(content)
    for argv, what in (
        (["profile", str(path)], "config.json"),
        (["explain", str(path)], "plan"),
        (["export", str(path), "--format", "megatron"], "plan"),
        (["run", str(path), "--steps", "1"], "plan"),
        (["report", str(path), "--out", str(tmp_path / "r")], "report input"),
        (["estimate", "gpt2", "--hardware", str(path), "--gpus", "8"], "hardware profile"),
    ):
        one_line(runner.invoke(app, argv), f"{what} {path}: nested deeper than 64 levels")


# ------------------------------------------------------------------------------ plan validation


def _plan(tmp_path, edit, name="plan.json") -> str:
    doc = json.loads(
        (TESTS / "data" / "plan_estimated.json").read_text()
    )  # `planner estimate --json`
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))  # json.dumps writes NaN and Infinity: as a careless tool would
    return str(path)


def _set(*keys, value):
    def edit(doc):
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return edit


@pytest.mark.parametrize(
    "edit,needle",
    [
        (_set("prediction", "step_time_s", value=float("nan")), "prediction.step_time_s=nan"),
        (_set("prediction", "tokens_per_s", value=float("inf")), "prediction.tokens_per_s=inf"),
        (_set("prediction", "step_time_s", value=1e308), "prediction.step_time_s=1e+308"),
        (
            _set("prediction", "time_breakdown_s", "bubble", value=-1e31),
            "prediction.time_breakdown_s.bubble=-1e+31",
        ),
        (
            _set("prediction", "memory", "peak_bytes_per_gpu", value=10**40),
            "prediction.memory.peak_bytes_per_gpu=",
        ),
        (_set("plan", "seq", value=10**6), "plan.seq=1000000"),
    ],
)
def test_one_plan_validation_for_every_command_that_reads_plans(tmp_path, edit, needle):
    path = _plan(tmp_path, edit)
    for argv in (
        ["explain", path],
        ["export", path, "--format", "megatron"],
        ["run", path, "--steps", "1"],
        ["report", path, "--out", str(tmp_path / "r")],
    ):
        one_line(runner.invoke(app, argv), needle)


def test_the_example_plan_is_valid_for_every_command(tmp_path):
    path = _plan(tmp_path, lambda doc: None)
    assert runner.invoke(app, ["explain", path]).exit_code == 0
    assert runner.invoke(app, ["export", path, "--format", "megatron"]).exit_code == 0


def test_a_learned_position_table_bounds_the_plans_sequence(tmp_path):
    # the plan of a catalog model without model.arch (older files) is checked against the catalog
    plan = json.loads((TESTS / "data" / "plan_example.json").read_text())
    assert plan["model"]["name"] == "gpt3-175b"
    doc = copy.deepcopy(plan)
    doc["model"].pop("arch", None)
    doc["plan"]["seq"] = 4096
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    one_line(runner.invoke(app, ["explain", str(path)]), "plan.seq=4096", "at most 2048")


# ---------------------------------------------------------------------------- results on stdout


def test_estimate_prints_its_result_on_stdout_and_nothing_on_stderr():
    result = runner.invoke(app, EST)
    assert result.exit_code == 0
    assert (
        "time per step" in result.stdout
        and "memory per GPU" in result.stdout
        and "fits" in result.stdout
    )
    assert result.stderr == ""


def test_recommend_json_is_the_only_thing_on_stdout(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, [*REC, "--json", "--out", str(out), "--tokens", "1B"])
    assert result.exit_code == 0, result.output
    doc = _strict(result.stdout)
    assert doc["best"]["plan"] == _strict(out.read_text())["plan"]
    assert f"wrote {out}" in result.stderr and "wrote" not in result.stdout


def test_recommend_table_on_stdout_and_the_written_note_on_stderr(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, [*REC, "--out", str(out)])
    assert result.exit_code == 0 and "dp.tp.pp" in result.stdout and "wrote" not in result.stdout
    assert result.stderr.strip() == f"wrote {out}"


# ------------------------------------------------------------------------------ writing outputs


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda d: d / "missing" / "out.json", "does not exist"),
        (lambda d: d, "is a directory"),
        (lambda d: d / "file.txt" / "out.json", "is not a directory"),
    ],
)
def test_unwritable_out_paths_are_one_line_and_nothing_is_written(tmp_path, make, needle):
    (tmp_path / "file.txt").write_text("")
    target = make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    plan = str(TESTS / "data" / "plan_example.json")
    for argv, flag in (
        ([*REC, "--out", str(target)], "--out"),
        ([*REC, "--csv", str(target)], "--csv"),
        (["export", plan, "--format", "deepspeed", "--out", str(target)], "--out"),
    ):
        one_line(runner.invoke(app, argv), f"{flag} {target}", needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_export_out_writes_the_configuration_whole(tmp_path):
    out = tmp_path / "ds.json"
    out.write_text("old")
    plan = str(
        TESTS / "data" / "plan_example.json"
    )  # made for megatron: interleaved, not deepspeed
    result = runner.invoke(app, ["export", plan, "--format", "sagemaker-v1", "--out", str(out)])
    assert result.exit_code == 0 and result.stdout == ""
    assert (
        out.read_text() == runner.invoke(app, ["export", plan, "--format", "sagemaker-v1"]).stdout
    )
    assert [p.name for p in tmp_path.iterdir()] == ["ds.json"]


# ---------------------------------------------------------------------------- non-finite numbers


@pytest.fixture()
def zero_efficiency_profile(tmp_path):
    """p4d.24xlarge with a GEMM efficiency of 0, which would make every step time infinite or NaN: the
    hardware loader refuses it naming the key, and were it let through, no command would rank or
    write the result (the monkeypatched tests below take that path)."""
    doc = json.loads((PROFILES / "p4d.24xlarge.json").read_text())
    for key in ("gemm_efficiency_max", "gemm_efficiency_max_fp32"):
        doc["efficiency"][key] = 0
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["estimate", "gpt2", "--gpus", "8", "--dp", "8", "--json"], "not a finite number"),
        (["estimate", "gpt2", "--gpus", "8", "--dp", "8"], "not a finite number"),
        (["recommend", "gpt2", "--gpus", "8"], "infinite or undefined step time"),
        (["recommend", "gpt2", "--gpus", "8", "--json"], "infinite or undefined step time"),
    ],
)
def test_infinite_step_times_are_never_ranked_or_written(
    zero_efficiency_profile, tmp_path, argv, needle
):
    out = tmp_path / "plan.json"
    argv = [*argv, "--hardware", zero_efficiency_profile]
    if argv[0] == "recommend":
        argv += ["--out", str(out)]
    result = runner.invoke(app, argv)
    line = result.stderr.strip().splitlines()[-1]
    assert result.exit_code == 2 and result.stdout == "" and not out.exists(), result.output
    assert line.startswith("error: ") and ("efficien" in line or "finite" in line or needle in line)
    assert "Traceback" not in result.output


def test_search_ranks_only_finite_step_times():
    import numpy as np

    from planner.search import ScoredSpace, SearchStats, rank

    arrays = {"dp": np.array([1, 2, 4, 8])}
    scored = ScoredSpace(
        arrays=arrays,
        step_time_s=np.array([np.inf, 2.0, np.nan, 1.0]),
        peak_bytes_per_gpu=np.array([1.0, 1.0, 1.0, 1.0]),
        capacity_bytes=10.0,
        needed_bytes=np.array([1.0, 1.0, 1.0, 1.0]),
        leanest_arrays=arrays,
        leanest_needed_bytes=np.ones(4),
        stats=SearchStats(candidates_evaluated=4, feasible=4, seconds=0.0),
    )
    assert list(rank(scored, "throughput")) == list(rank(scored, "cost")) == [3, 1]
    assert list(rank(scored, "memory")) == [3]


def test_recommend_refuses_when_every_fitting_candidate_is_infinite():
    import numpy as np

    from planner.errors import ConfigError
    from planner.score import score
    from planner.search import recommend

    def infinite(*args, **kwargs):
        scores = score(*args, **kwargs)
        return type(scores)(
            **{
                **{f: getattr(scores, f) for f in scores.__dataclass_fields__},
                "step_time_s": np.full_like(np.asarray(scores.step_time_s, float), np.inf),
            }
        )

    with pytest.raises(
        ConfigError, match=r"every candidate that fits \([0-9,]+\) has an infinite or undefined"
    ):
        recommend("gpt2", "p4d.24xlarge", gpus=8, score_fn=infinite)


@pytest.mark.parametrize("json_flag", [["--json"], []])
def test_a_non_finite_prediction_is_one_line_and_never_printed(monkeypatch, json_flag):
    from planner import estimate as estimate_module

    real = estimate_module.Estimate.to_document

    def broken(self):
        doc = real(self)
        doc["prediction"]["time_breakdown_s"]["bubble"] = float("nan")
        return doc

    monkeypatch.setattr(estimate_module.Estimate, "to_document", broken)
    one_line(
        runner.invoke(app, [*EST, *json_flag]),
        "prediction.time_breakdown_s.bubble is nan, not a finite number",
    )


# ----------------------------------------------------------------------- scored candidates table


def test_to_pandas_holds_every_scored_candidate_with_readable_knobs():
    import pandas as pd

    import planner
    from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES
    from planner.placement import PLACEMENTS

    rec = planner.recommend("gpt2", "p4d.24xlarge", gpus=8, global_batch=64)
    frame = rec.to_pandas()
    assert (
        len(frame) == rec.stats.candidates_evaluated
        and int(frame["fits"].sum()) == rec.stats.feasible
    )
    assert {
        "dp",
        "tp",
        "pp",
        "micro_batch",
        "zero",
        "step_time_s",
        "peak_bytes_per_gpu",
        "fits",
    } <= set(frame)
    assert set(frame["schedule"]) <= set(SCHEDULES) and set(frame["recompute"]) <= set(RECOMPUTE)
    assert set(frame["offload"]) <= set(OFFLOAD)
    assert {p.replace("C", "").replace("E", "") for p in frame["placement"]} <= set(PLACEMENTS)
    assert (frame["dp"] * frame["tp"] * frame["pp"] * frame["cp"] == 8).all()
    plan = rec.best["plan"]
    knobs = (
        "dp",
        "tp",
        "pp",
        "cp",
        "cp_comm",
        "dp_shard",
        "micro_batch",
        "zero",
        "recompute",
        "offload",
        "sequence_parallel",
        "schedule",
        "placement",
        "virtual_stages",
    )
    row = frame[(frame[list(knobs)] == pd.Series({k: plan[k] for k in knobs})).all(axis=1)]
    assert len(row) == 1 and bool(row["fits"].iloc[0])
    # the table holds the search's closed form (its ranking); the plan document the simulated step
    from planner.estimate import estimate
    from planner.plan import plan_from_document

    best = plan_from_document(rec.best).config
    closed = estimate("gpt2", "p4d.24xlarge", best, gpus=8).scores.closed_form_step_s
    assert row["step_time_s"].iloc[0] == pytest.approx(float(closed[0]), rel=1e-9)


def test_recommend_csv_writes_every_scored_candidate_fitting_and_fastest_first(tmp_path):
    import pandas as pd

    import planner

    path = tmp_path / "candidates.csv"
    result = runner.invoke(app, [*REC, "--global-batch", "64", "--csv", str(path)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(path)
    expected = planner.recommend("gpt2", "p4d.24xlarge", gpus=8, global_batch=64).to_pandas()
    assert len(table) == len(expected) and list(table.columns) == list(expected.columns)
    fits = table["fits"].to_numpy()
    assert fits[: fits.sum()].all() and not fits[fits.sum() :].any()  # fitting rows first
    steps = table["step_time_s"].to_numpy()
    assert (steps[: fits.sum()][1:] >= steps[: fits.sum()][:-1]).all()  # fastest first among them
    assert sorted(steps) == pytest.approx(sorted(expected["step_time_s"]))
    assert f"wrote {path}" in result.stderr


def test_an_output_never_replaces_the_input_it_was_made_from(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text((TESTS / "data" / "plan_example.json").read_text())
    before = plan.read_text()
    one_line(
        runner.invoke(app, ["export", str(plan), "--format", "deepspeed", "--out", str(plan)]),
        "is the plan this command reads",
    )
    profile = tmp_path / "hw.json"
    profile.write_text((PROFILES / "p4d.24xlarge.json").read_text())
    one_line(
        runner.invoke(
            app,
            ["recommend", "gpt2", "--hardware", str(profile), "--gpus", "8", "--csv", str(profile)],
        ),
        "is the hardware profile this command reads",
    )
    one_line(
        runner.invoke(
            app, [*REC, "--out", str(tmp_path / "a.json"), "--csv", str(tmp_path / "a.json")]
        ),
        "--csv=",
        "other than --out",
    )
    assert plan.read_text() == before and json.loads(profile.read_text())["name"] == "p4d.24xlarge"


@pytest.mark.parametrize("key", ["hidden_size", "vocab_size"])
def test_a_model_too_large_to_compute_with_is_one_line(tmp_path, key):
    config = dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    config[key] = 10**20
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    one_line(
        runner.invoke(
            app,
            [
                "estimate",
                str(path),
                "--hardware",
                "p4d.24xlarge",
                "--gpus",
                "8",
                "--dp",
                "8",
                "--global-batch",
                "8",
            ],
        ),
        "up to",
        key.removesuffix("_size"),
    )
