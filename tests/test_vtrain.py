"""vTrain's measured Megatron-DeepSpeed steps (validation/vtrain, benchmarks/accuracy_vtrain.py): the rows
load as published and every kind of them predicts."""

import csv
from pathlib import Path

import pytest

from benchmarks import accuracy_vtrain as V
from benchmarks.stack_predictions import predict

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "validation" / "vtrain"


def _csv_rows(name: str) -> list[list[str]]:
    with open(DATA / name, encoding="utf-8-sig") as f:
        return list(csv.reader(f))[1:]


def test_the_vendored_rows_load_as_published():
    single, multi = V.measured_rows("single"), V.measured_rows("multi")
    assert (len(single), len(multi)) == (len(_csv_rows("ground_truth_single.csv")), 109)
    assert len(single) == 1440
    first = _csv_rows("ground_truth_single.csv")[0]
    assert single[0]["step_s"] == pytest.approx(float(first[10]) / 1000)
    for m in single + multi:
        assert m["tp"] * m["dp"] * m["pp"] == m["gpus"]
        assert m["global_batch"] % (m["micro_batch"] * m["dp"]) == 0
    assert max(m["gpus"] for m in single) == 8
    assert {m["gpus"] for m in multi} == {64, 256, 512}


def test_megatron_pads_the_vocabulary_by_128_tp():
    assert V.padded_vocab(1) == 50304
    assert V.padded_vocab(8) == 51200


@pytest.fixture(scope="module")
def single_cases():
    return V.cases("single")


def test_a_sample_of_every_vtrain_row_kind_predicts_and_fits(single_cases):
    sample = single_cases[::97] + V.cases("multi")[::9]
    results = [predict(c) for c in sample]
    assert all(r.refused is None for r in results)
    assert all(r.fits for r in results)
    assert all(r.predicted_s > 0 for r in results)
