"""Every published run row (validation/published/*.json) against the one declared row schema
(benchmarks/published_schema.py): one table-driven check whose failure names every bad row."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks.published_rows import PUBLISHED
from benchmarks.published_schema import check_row
from planner.errors import ConfigError

COLLECTIONS = {path.stem: json.loads(path.read_text()) for path in PUBLISHED.glob("*.json")}


def row_failures(collections: dict[str, dict]) -> list[str]:
    """One line per bad row: the schema's refusal, a source_id its file does not list, or an id
    another row already has."""
    out, seen = [], {}
    for name, data in sorted(collections.items()):
        for index, row in enumerate(data["runs"]):
            origin = f"{name}.json runs[{index}] ({row.get('id')})"
            try:
                check_row(row, origin)
            except ConfigError as err:
                out.append(str(err))
                continue
            if row["source_id"] not in data["sources"]:
                out.append(f"{origin}: source_id {row['source_id']!r} is not in its sources")
            if row["id"] in seen:
                out.append(f"{origin}: id {row['id']!r} already used in {seen[row['id']]}")
            seen.setdefault(row["id"], origin)
    return out


def test_the_collections_are_all_read():
    assert set(COLLECTIONS) >= {"megatron", "torchtitan", "fsdp", "deepspeed", "features", "moe"}
    assert all(data["runs"] for data in COLLECTIONS.values())


def test_every_published_row_fits_the_row_schema():
    bad = row_failures(COLLECTIONS)
    assert not bad, f"{len(bad)} bad rows:\n" + "\n".join(bad)


def _one_row_changed(change) -> dict[str, dict]:
    data = copy.deepcopy(COLLECTIONS["megatron"])
    change(data["runs"][0])
    return {"megatron": data}


@pytest.mark.parametrize(
    "change,needle",
    [
        (lambda r: r.update(tensor_parallel=8), "unknown key 'tensor_parallel'"),
        (lambda r: r.update(gpus="64"), "gpus='64' is invalid"),
        (lambda r: r.update(gpus=64.0), "gpus=64.0 is invalid"),
        (lambda r: r.update(sequence_parallel=1), "sequence_parallel=1 is invalid"),
        (lambda r: r.update(precision="bf17"), "precision='bf17' is invalid"),
        (lambda r: r.update(hardware="dgx-h900"), "hardware='dgx-h900' is invalid"),
        (lambda r: r["extras"].update(overlap_grad_reduced=True), "'extras.overlap_grad_reduced'"),
        (lambda r: r["extras"].update(loss_fn="softmax"), "extras.loss_fn='softmax'"),
        (lambda r: r["measured"].update(mfu=1.5), "measured.mfu=1.5"),
        (lambda r: r.pop("seq"), "missing required key 'seq'"),
        (lambda r: r.update(model=None), "missing required key 'arch.model_type'"),
        (lambda r: r.update(source_id="nowhere-2099"), "source_id 'nowhere-2099'"),
    ],
)
def test_a_bad_row_is_named_with_its_key(change, needle):
    collections = _one_row_changed(change)
    row_id = collections["megatron"]["runs"][0]["id"]
    bad = row_failures(collections)
    assert len(bad) == 1 and needle in bad[0] and row_id in bad[0], bad


def test_two_bad_rows_are_both_named():
    data = copy.deepcopy(COLLECTIONS["fsdp"])
    data["runs"][0]["gpus"] = 0
    data["runs"][1]["id"] = data["runs"][2]["id"]
    bad = row_failures({"fsdp": data})
    assert len(bad) == 2 and "gpus=0" in bad[0] and "already used" in bad[1], bad
