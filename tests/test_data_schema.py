"""planner.data_schema: the one declarative checker of the data files (issue 29). Each case states
the rule of the declaration and the one line a refusal must be."""

from __future__ import annotations

import pytest

from planner.data_schema import Field, check_document, check_sources, describe, reference_table
from planner.errors import ConfigError

FIELDS = {
    "gpus": Field(kind="int", low=1, high=8, unit="GPUs", doc="GPUs.", sourced=True),
    "rate": Field(kind="number", low=0, low_open=True, high=1, high_open=True, doc="A rate."),
    "mode": Field(kind="str", allowed=("a", "b"), required=False, default="a", doc="Mode."),
    "limit": Field(kind="number", nullable=True, null_means="no limit", doc="Limit.", sourced=True),
    "stages": Field(kind="list", items="int", low=0, required=False, doc="Stages."),
    "inner": Field(
        kind="object", required=False, fields={"x": Field(kind="bool", doc="X.")}, doc="Inner."
    ),
    "sources": Field(kind="strings", required=False, doc="Sources."),
}
GOOD = {"gpus": 8, "rate": 0.5, "limit": None}


def _refusal(doc: dict) -> str:
    with pytest.raises(ConfigError) as err:
        check_document(doc, FIELDS, "f.json", "thing")
    return str(err.value)


def test_a_good_document_passes_and_optional_keys_may_be_absent():
    check_document(GOOD, FIELDS, "f.json", "thing")
    check_document({**GOOD, "mode": "b", "stages": [0, 3], "inner": {"x": True}}, FIELDS, "", "")


@pytest.mark.parametrize(
    "change,line",
    [
        ({"gpus": 0}, "thing f.json: gpus=0 is invalid: allowed an integer >= 1 and <= 8 (GPUs)"),
        ({"gpus": 9}, "gpus=9 is invalid"),
        ({"gpus": 8.0}, "gpus=8.0 is invalid"),
        ({"gpus": True}, "gpus=True is invalid"),
        ({"rate": 0}, "rate=0 is invalid: allowed a number > 0 and < 1"),
        ({"rate": 1}, "rate=1 is invalid"),
        ({"rate": float("nan")}, "rate=nan is invalid"),
        ({"rate": None}, "rate=None is invalid"),
        ({"mode": "c"}, 'mode=\'c\' is invalid: allowed a string: one of "a", "b"'),
        ({"stages": [1, -1]}, "stages=[1, -1] is invalid: allowed a list of integers >= 0"),
        ({"stages": [1, 2.5]}, "stages=[1, 2.5] is invalid"),
        ({"inner": {"x": 1}}, "inner.x=1 is invalid: allowed true or false"),
        ({"inner": {"x": True, "y": 1}}, "unknown key 'inner.y' (value 1); allowed keys: x"),
        ({"inner": {}}, "missing required key 'inner.x' (true or false)"),
        ({"sources": {"gpus": " "}}, "sources.gpus=' ' is invalid: allowed a non-empty string"),
        (
            {"colour": "blue"},
            "thing f.json: unknown key 'colour' (value 'blue'); allowed keys: gpus",
        ),
    ],
)
def test_each_refusal_is_one_line_naming_file_key_value_and_rule(change, line):
    message = _refusal({**GOOD, **change})
    assert line in message and "\n" not in message


def test_a_missing_key_and_a_non_object_are_named():
    assert "thing f.json: missing required key 'rate'" in _refusal({"gpus": 8, "limit": 1.0})
    assert "thing f.json: <document>=[1] is invalid: allowed a JSON object" in _refusal([1])


def test_sourced_values_need_a_source_and_nulls_only_when_asked():
    doc = {**GOOD, "sources": {"gpus": "the datasheet"}}
    check_sources(doc, FIELDS, "f.json", "thing")  # limit is null: no source needed
    with pytest.raises(ConfigError, match="missing required key 'sources.limit'"):
        check_sources(doc, FIELDS, "f.json", "thing", nulls=True)


def test_describe_and_the_reference_table_say_the_same_rule():
    assert describe(FIELDS["limit"]) == "a number, or null (no limit)"
    table = reference_table(FIELDS)
    assert "| `gpus` | an integer >= 1 and <= 8 (GPUs) | required, sourced | GPUs. |" in table
    assert '| `mode` | a string: one of "a", "b" | optional, default "a" | Mode. |' in table
    assert "| `inner.x` | true or false | required | X. |" in table
