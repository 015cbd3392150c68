"""The prediction snapshot (benchmarks/prediction_snapshot.py): every published row's estimate and a
dozen searches' top plans equal tests/golden/predictions.json. A refactor keeps it identical; a change
that moves a prediction on purpose rewrites the file in the same commit (`--write`) and says why."""

from __future__ import annotations

import json

from benchmarks import prediction_snapshot as S
from benchmarks.published_rows import load


def test_estimates_and_searches_equal_the_golden_snapshot():
    golden = json.loads(S.GOLDEN.read_text())
    assert len(golden["estimate"]) >= 800 and len(golden["recommend"]) == len(S.RECOMMENDS)
    moved = list(S.differences(golden, S._normalized(S.snapshot())))
    assert not moved, f"{len(moved)} predictions moved, first: " + "; ".join(moved[:10])


def test_the_comparison_sees_a_moved_number_a_new_key_and_a_changed_plan():
    golden = {"a": {"step_time_s": 1.0, "plan": {"tp": 2}}, "b": [1, 2]}
    assert not list(
        S.differences(golden, {"a": {"step_time_s": 1.0 + 1e-12, "plan": {"tp": 2}}, "b": [1, 2]})
    )
    assert not list(S.differences({"bubble": 0.0}, {"bubble": 3e-14}))
    assert list(S.differences({"bubble": 0.0}, {"bubble": 2e-12}))
    moved = list(
        S.differences(golden, {"a": {"step_time_s": 1.001, "plan": {"tp": 4}, "x": 0}, "b": [1]})
    )
    assert moved == [
        "/a/plan/tp: 2 -> 4",
        "/a/step_time_s: 1.0 -> 1.001",
        "/a/x: new",
        "/b: [1, 2] -> [1]",
    ]


def test_every_published_run_that_trained_is_predicted_to_fit():
    """A run its source reports a step for (`trained`) ran in its device's memory, so estimate() must
    not call it out of memory (issue 32: none predicted not to fit). Read off the golden file, which
    the test above holds equal to estimate() of every row."""
    golden = json.loads(S.GOLDEN.read_text())["estimate"]
    trained = [case.id for case in load(S.PUBLISHED_FILES) if case.row.get("trained")]
    assert len(trained) >= 800
    scored = [i for i in trained if "memory" in golden[i]]
    assert len(scored) >= len(trained) - 5  # rows refused or unusable are few and listed
    out = [i for i in scored if not golden[i]["memory"]["fits"]]
    assert not out, f"{len(out)} runs that trained are predicted not to fit: {out[:5]}"
