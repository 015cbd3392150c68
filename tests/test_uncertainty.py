"""Near-ties are ties (issue 32): each plan's error band comes from the measured leave-one-source-out
error of its stack at its scale, and plans closer than that to the fastest are reported as ties."""

import json

import pytest

from benchmarks import model_error
from planner import uncertainty as U


def test_the_shipped_errors_are_the_recorded_accuracy_results():
    recorded = json.loads(model_error.ACCURACY.read_text())
    moe = json.loads(model_error.MOE_ACCURACY.read_text())
    derived = model_error.derive(recorded, moe)
    assert json.loads(U.ERRORS.read_text()) == json.loads(json.dumps(derived))


def test_a_mixture_of_experts_plan_takes_the_moe_runs_error_where_it_is_larger():
    moe = json.loads(model_error.MOE_ACCURACY.read_text())
    small = [abs(r["loo_error"]) for r in moe["rows"] if r["gpus"] <= 512]
    band = U.error_band("megatron", 64, moe=True)
    assert band.mape == pytest.approx(sum(small) / len(small), 1e-3)
    assert band.rows == len(small) and "accuracy_moe" in band.source
    assert band.mape > U.error_band("megatron", 64).mape  # MoE steps are the less certain
    huge = U.error_band("megatron", 10_240, moe=True)  # no MoE run above 4,096 GPUs: over all
    assert huge.mape == pytest.approx(moe["loo_mape"], 1e-3) and not huge.measured_at_scale
    dense = _doc(2.0)
    sparse = {**dense, "model": {"arch": {"moe": {"experts": 8, "top_k": 2}}}}
    bands = [d["prediction"]["uncertainty"] for d in U.with_bands([dense, sparse])]
    assert bands[0]["mape"] == U.error_band("megatron", 64).mape
    assert bands[1]["mape"] == band.mape and "accuracy_moe" in bands[1]["source"]


def test_a_band_is_the_stack_error_at_its_scale_or_over_all_scales():
    recorded = json.loads(model_error.ACCURACY.read_text())
    small = U.error_band("megatron", 64)
    assert small.scale == "<= 512" and small.measured_at_scale
    assert small.mape == pytest.approx(recorded["scale_bands"]["megatron <= 512"]["loo_mape"], 1e-3)
    huge = U.error_band("megatron", 10_240)  # no published Megatron row above 4,096 GPUs
    assert huge.scale == "> 4,096" and not huge.measured_at_scale
    overall = recorded["leave_one_source_out"]["framework"]["megatron"]["mape"]
    assert huge.mape == pytest.approx(overall, 1e-3)
    assert U.error_band("no-such-stack", 8) is None


def test_a_band_of_few_runs_does_not_stand_for_its_scale():
    recorded = json.loads(model_error.ACCURACY.read_text())
    thin = recorded["scale_bands"]["deepspeed 513-4,096"]
    assert thin["rows"] < U.MIN_BAND_ROWS  # the recorded results' own count
    band = U.error_band("deepspeed", 1024)
    overall = recorded["leave_one_source_out"]["framework"]["deepspeed"]["mape"]
    assert band.mape == pytest.approx(overall, 1e-3) and not band.measured_at_scale


def _doc(step, *, peak_gib=40.0, fits=True, gpus=64, **degrees):
    plan = {"framework": "megatron", "dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, **degrees}
    return {
        "plan": plan,
        "hardware": {"gpus": gpus},
        "prediction": {
            "step_time_s": step,
            "memory": {"peak_bytes_per_gpu": int(peak_gib * 2**30), "fits": fits},
        },
    }


def test_bands_bracket_each_step_and_copy_the_documents():
    docs = [_doc(2.0, dp=64), _doc(2.5, dp=32, tp=2)]
    banded = U.with_bands(docs)
    mape = U.error_band("megatron", 64).mape
    for doc, out in zip(docs, banded):
        low, high = out["prediction"]["uncertainty"]["step_time_s"]
        step = doc["prediction"]["step_time_s"]
        assert low == pytest.approx(step * (1 - mape)) and high == pytest.approx(step * (1 + mape))
        assert "uncertainty" not in doc["prediction"]


def test_ties_are_the_fitting_plans_within_the_error_and_the_simplest_is_preferred():
    mape = U.error_band("megatron", 64).mape
    docs = [
        _doc(2.0, dp=16, tp=2, pp=2, peak_gib=70),  # fastest, three axes
        _doc(2.0 * (1 + mape / 2), dp=32, tp=2, peak_gib=60),  # tied, two axes
        _doc(2.0 * (1 + mape / 3), dp=64, peak_gib=75, fits=False),  # does not fit: no tie
        _doc(2.0 * (1 + mape / 4), dp=32, cp=2, peak_gib=50),  # tied, two axes, less memory
        _doc(2.0 * (1 + 2 * mape), dp=64, peak_gib=30),  # beyond the error
    ]
    ties = U.ties_of(docs, "throughput")
    assert ties["plans"] == [0, 1, 3]
    assert ties["preferred"] == 3
    assert U.ties_of(docs, "memory") is None


def _tied_documents():
    mape = U.error_band("megatron", 64).mape
    return [
        _doc(2.0, dp=16, tp=2, pp=2, peak_gib=70),  # fastest, three axes
        _doc(2.0 * (1 + mape / 2), dp=32, tp=2, peak_gib=60),  # tied, two axes
        _doc(2.0 * (1 + mape / 3), dp=64, peak_gib=75, fits=False),  # does not fit
        _doc(2.0 * (1 + mape / 4), dp=32, cp=2, peak_gib=50),  # tied: the one to prefer
        _doc(2.0 * (1 + 2 * mape), dp=64, peak_gib=30),  # beyond the error
    ]


def test_the_tie_to_prefer_is_ranked_first_and_the_fastest_is_named():
    docs = _tied_documents()
    ties = U.ties_of(docs, "throughput")
    ranked, moved = U.ranked_by_preference(docs, ties, "headroom")
    assert ranked == [docs[3], docs[0], docs[1], docs[2], docs[4]]  # the rest keep their order
    assert moved["preferred"] == 0 and moved["fastest"] == 1 and moved["plans"] == [0, 1, 2]
    same, kept = U.ranked_by_preference(docs, ties, "fastest")
    assert same == docs and kept["preferred"] == 3 and kept["fastest"] == 0
    assert kept["plans"] == [0, 1, 3] and ties["plans"] == [0, 1, 3]  # not changed in place
    assert U.ranked_by_preference(docs, None, "headroom") == (docs, None)


def test_recommend_ranks_the_tie_with_fewest_axes_first_unless_asked_for_the_fastest():
    from planner.search import recommend

    # GPT-3 13B on 32 A100s: five plans within the error, the leanest of them not the fastest
    headroom = recommend("gpt3-13b", "p4d.24xlarge", gpus=32)
    fastest = recommend("gpt3-13b", "p4d.24xlarge", gpus=32, prefer="fastest")
    by_headroom = [headroom.best, *headroom.alternatives]
    by_step = [fastest.best, *fastest.alternatives]
    steps = [d["prediction"]["step_time_s"] for d in by_step]
    assert steps == sorted(steps)  # the predicted order
    assert sorted(map(key, by_headroom)) == sorted(map(key, by_step))  # the same plans
    ties = headroom.best["search"]["near_ties"]
    tied = [by_headroom[i] for i in ties["plans"]]
    simplest = min(
        (U.axes(d["plan"]), d["prediction"]["memory"]["peak_bytes_per_gpu"]) for d in tied
    )
    best = headroom.best
    assert (U.axes(best["plan"]), best["prediction"]["memory"]["peak_bytes_per_gpu"]) == simplest
    assert key(by_headroom[ties["fastest"]]) == key(fastest.best)
    assert ties["fastest"] != 0 and key(headroom.best) != key(fastest.best)  # it did reorder


def key(document) -> str:
    return json.dumps(document["plan"], sort_keys=True)


def test_recommend_reports_its_ties_with_bands():
    from planner.search import recommend

    rec = recommend("llama3-8b", "dgx-h100", gpus=64, global_batch=512)
    plans = [rec.best, *rec.alternatives]
    ties = rec.best["search"]["near_ties"]
    fastest = plans[ties["fastest"]]["prediction"]["step_time_s"]
    for i, doc in enumerate(plans):
        band = doc["prediction"]["uncertainty"]
        assert band["step_time_s"][0] < doc["prediction"]["step_time_s"] < band["step_time_s"][1]
        tied = doc["prediction"]["step_time_s"] < fastest * (1 + ties["mape"])
        assert (i in ties["plans"]) == (tied and doc["prediction"]["memory"]["fits"])


def test_the_cli_says_which_plan_is_fastest_and_refuses_an_unknown_preference():
    from typer.testing import CliRunner

    from planner.cli import app

    args = ["recommend", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "64"]
    result = CliRunner().invoke(app, [*args, "--json"])
    ties = json.loads(result.stdout)["best"]["search"]["near_ties"]
    text = CliRunner().invoke(app, args).stdout
    line = next(line for line in text.splitlines() if line.startswith("near-ties:"))
    if ties["fastest"] != 0:
        assert f"#{ties['fastest'] + 1} is predicted fastest (--prefer fastest" in line
    bad = CliRunner().invoke(app, [*args, "--prefer", "cheapest"])
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.exit_code == 2 and len(lines) == 1 and "prefer" in lines[0], bad.stderr
    assert "headroom, fastest" in lines[0]
