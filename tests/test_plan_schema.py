"""The plan schema's value lists are the code's (planner.schema_enums, issue 29 item 4)."""

import json

import pytest

from planner import schema_enums as E
from planner.parallel import SCHEDULES


def _shipped() -> dict:
    return json.loads(E.SCHEMA.read_text(encoding="utf-8"))


@pytest.mark.parametrize("schema", list(E.SCHEMA_ENUMS), ids=lambda path: path.name)
def test_the_published_schema_lists_the_codes_values(schema):
    shipped = json.loads(schema.read_text(encoding="utf-8"))
    enums = E.SCHEMA_ENUMS[schema]
    stale = [
        "/".join(path)
        for path, values in enums.items()
        if E.node(shipped, path)["enum"] != list(values)
    ]
    assert stale == [], "run `python -m planner.schema_enums`: " + ", ".join(stale)
    assert E.generated(shipped, enums) == shipped


def test_a_value_added_in_code_reaches_the_schema(tmp_path, monkeypatch):
    path = tmp_path / "plan.schema.json"
    path.write_text(E.SCHEMA.read_text(encoding="utf-8"), encoding="utf-8")
    where = (*E._PLAN, "schedule")
    monkeypatch.setitem(E.CODE_ENUMS, where, (*SCHEDULES, "dualpipe"))
    E.write(path)
    written = json.loads(path.read_text(encoding="utf-8"))
    assert E.node(written, where)["enum"] == [*SCHEDULES, "dualpipe"]
    assert E.node(_shipped(), where)["enum"] == list(SCHEDULES)  # the shipped file untouched


def test_a_run_option_added_in_code_reaches_the_software_block_schema(tmp_path, monkeypatch):
    path = tmp_path / "plan.schema.json"
    path.write_text(E.SCHEMA.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setitem(E.SOFTWARE_TYPES, "new_switch", "boolean")
    E.write(path)
    written = json.loads(path.read_text(encoding="utf-8"))
    assert E.node(written, (*E._SOFTWARE, "new_switch"))["type"] == "boolean"
    assert "new_switch" not in E.node(_shipped(), E._SOFTWARE)


def test_every_option_a_plan_records_has_its_schema_type():
    from planner.estimate import written_options

    software = E.node(_shipped(), E._SOFTWARE)
    assert set(written_options()) <= set(software)
    assert software["cuda_graphs"]["type"] == "boolean"
    assert software["recompute_modules"]["type"] == "array"
    assert software["moe_imbalance"]["type"] == "number"
