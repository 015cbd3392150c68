"""Near-ties are ties (issue 32): each plan's error band comes from the measured leave-one-source-out
error of its stack at its scale, and plans closer than that to the fastest are reported as ties."""

import json

import pytest

from benchmarks import model_error
from planner import uncertainty as U


def test_the_shipped_errors_are_the_recorded_accuracy_results():
    recorded = json.loads(model_error.ACCURACY.read_text())
    assert json.loads(U.ERRORS.read_text()) == json.loads(json.dumps(model_error.derive(recorded)))


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


def test_recommend_reports_its_ties_with_bands():
    from planner.search import recommend

    rec = recommend("llama3-8b", "dgx-h100", gpus=64, global_batch=512)
    plans = [rec.best, *rec.alternatives]
    ties = rec.best["search"]["near_ties"]
    fastest = rec.best["prediction"]["step_time_s"]
    for i, doc in enumerate(plans):
        band = doc["prediction"]["uncertainty"]
        assert band["step_time_s"][0] < doc["prediction"]["step_time_s"] < band["step_time_s"][1]
        tied = doc["prediction"]["step_time_s"] < fastest * (1 + ties["mape"])
        assert (i in ties["plans"]) == (tied and doc["prediction"]["memory"]["fits"])
