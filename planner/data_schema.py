"""One declarative schema for the project's data files (issue 29): each kind of file (hardware
profile, storage profile, reliability defaults, published run row) declares its keys once as
`Field`s, and the same declaration validates a decoded document (`check_document`), requires a
source for every sourced value (`check_sources`) and documents the file (`reference_table`,
rendered into docs/data-files.md).

Every refusal is one ConfigError line naming the file, the key, the value and what is allowed:

>>> check_document({"gpus": 0}, {"gpus": Field(kind="int", low=1, doc="GPUs.")}, "x.json", "row")
Traceback (most recent call last):
...
planner.errors.ConfigError: row x.json: gpus=0 is invalid: allowed an integer >= 1
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping, NoReturn

from planner.errors import ConfigError

KINDS = ("str", "int", "number", "bool", "list", "object", "strings", "any")
"""str, int (not a bool, not a float), number (finite, not a bool), bool, list (of `items`),
object (a JSON object; its keys declared in `fields` when given), strings (an object of non-empty
strings, e.g. `sources`), any (not checked, null included: recorded as published)."""

_NOUNS = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "list": "a list",
    "object": "a JSON object",
    "strings": "an object of non-empty strings",
    "any": "any JSON value",
}
_PLURALS = {
    "str": "strings",
    "int": "integers",
    "number": "numbers",
    "bool": "booleans",
    "list": "lists",
    "object": "JSON objects",
    "strings": "objects of strings",
    "any": "JSON values",
}
_SHOWN_CHARS = 60
"""How much of a bad value an error line quotes (a whole object would not fit on one line)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """What one key of a data file may hold, and what it means."""

    kind: str
    """One of KINDS."""
    doc: str
    """One line: what the value is (its source, its convention)."""
    required: bool = True
    default: object = None
    """The value a reader takes when an optional key is absent (documented, not filled in; None:
    the key is simply absent)."""
    nullable: bool = False
    null_means: str = ""
    """What null stands for (shown in errors and docs), e.g. 'not a limit'."""
    nonempty: bool = False
    """A str (or each str of a list) must not be blank."""
    low: float | None = None
    """Smallest allowed number (inclusive unless `low_open`)."""
    low_open: bool = False
    high: float | None = None
    """Largest allowed number (inclusive unless `high_open`)."""
    high_open: bool = False
    unit: str = ""
    allowed: tuple = ()
    """The values a str, int (or each item of a list) may take; empty: any."""
    rule: str = ""
    """A further rule the reader checks itself, in words (shown in errors and docs)."""
    items: str = ""
    """A list's item kind (a KINDS entry); empty: any."""
    fields: Mapping[str, Field] | None = None
    """An object's keys, checked the same way (unknown keys refused); None: any keys."""
    sourced: bool = False
    """The file's `sources` must say where this value comes from (check_sources)."""

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        assert not self.items or self.items in KINDS, self.items


def describe(field: Field) -> str:
    """What `field` allows, in words: 'an integer >= 1 and <= 1024 (devices), or null'."""
    text = _NOUNS[field.kind]
    if field.kind == "list" and field.items:
        text = "a list of " + _PLURALS[field.items]
    if field.nonempty:
        text = text.replace("string", "non-empty string")
    if field.allowed:
        text += (" among " if field.kind == "list" else ": one of ") + ", ".join(
            map(json.dumps, field.allowed)
        )
    bounds = _bounds(field)
    text += f" {bounds}" if bounds else ""
    text += f" ({field.unit})" if field.unit else ""
    text += f", {field.rule}" if field.rule else ""
    if field.nullable:
        text += ", or null" + (f" ({field.null_means})" if field.null_means else "")
    return text


def _bounds(field: Field) -> str:
    parts = []
    if field.low is not None:
        parts.append(f"{'>' if field.low_open else '>='} {field.low:g}")
    if field.high is not None:
        parts.append(f"{'<' if field.high_open else '<='} {field.high:g}")
    return " and ".join(parts)


def check_document(
    data: object, fields: Mapping[str, Field], origin: str, what: str, *, prefix: str = ""
) -> None:
    """Refuse a document that is not an object, has a key `fields` does not declare, lacks a
    required key, or holds a value its Field does not allow: one ConfigError line
    '<what> <origin>: <key>=<value> is invalid: allowed <describe(field)>'. Nested objects with
    declared `fields` are checked the same way, their keys named 'outer.inner'."""
    if not isinstance(data, dict):
        fail(origin, what, prefix.rstrip(".") or "<document>", data, "a JSON object")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = prefix + unknown[0]
        raise ConfigError(
            key,
            data[unknown[0]],
            "one of the declared keys",
            message=f"{what} {origin}: unknown key {key!r} (value {_shown(data[unknown[0]])}); "
            "allowed keys: " + ", ".join(fields),
        )
    for name, field in fields.items():
        if name in data:
            check_value(data[name], field, origin, what, prefix + name)
        elif field.required:
            key = prefix + name
            raise ConfigError(
                key,
                None,
                describe(field),
                message=f"{what} {origin}: missing required key {key!r} ({describe(field)})",
            )


def check_value(value: object, field: Field, origin: str, what: str, key: str) -> None:
    """Refuse `value` unless `field` allows it (one ConfigError line naming `key`)."""
    if value is None:
        if not field.nullable and field.kind != "any":
            fail(origin, what, key, value, describe(field))
        return
    if not _value_ok(value, field.kind, field):
        fail(origin, what, key, value, describe(field))
    if field.kind == "list" and not all(
        _value_ok(item, field.items or "any", field) for item in value
    ):
        fail(origin, what, key, value, describe(field))
    if field.kind == "object" and field.fields is not None:
        check_document(value, field.fields, origin, what, prefix=f"{key}.")
    if field.kind == "strings":
        for name, text in value.items():
            if not isinstance(text, str) or not text.strip():
                fail(origin, what, f"{key}.{name}", text, "a non-empty string")


def _value_ok(value: object, kind: str, field: Field) -> bool:
    """Whether `value` is of `kind` and inside `field`'s vocabulary, bounds and blankness rule."""
    if kind == "any":
        return True
    if kind == "bool":
        return isinstance(value, bool)
    if kind in ("int", "number"):
        return _number_ok(value, kind, field)
    if kind == "str":
        blank = field.nonempty and isinstance(value, str) and not value.strip()
        return isinstance(value, str) and not blank and _allowed(value, field)
    if kind == "list":
        return isinstance(value, list)
    return isinstance(value, dict)  # object, strings


def _number_ok(value: object, kind: str, field: Field) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "int" and not isinstance(value, int):
        return False
    if not math.isfinite(value) or not _allowed(value, field):
        return False
    low, high = field.low, field.high
    too_low = low is not None and (value <= low if field.low_open else value < low)
    too_high = high is not None and (value >= high if field.high_open else value > high)
    return not (too_low or too_high)


def _allowed(value: object, field: Field) -> bool:
    return not field.allowed or value in field.allowed


def check_sources(
    data: Mapping, fields: Mapping[str, Field], origin: str, what: str, *, nulls: bool = False
) -> None:
    """Every present `sourced` key needs a non-empty entry in data['sources'] (the data is only as
    good as its provenance); a null value needs one only when `nulls` (a null that stands for 'not a
    limit' is itself a claim)."""
    sources = data.get("sources") or {}
    for name, field in fields.items():
        if not field.sourced or name not in data or (data[name] is None and not nulls):
            continue
        text = sources.get(name)
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(
                f"sources.{name}",
                None,
                "a source for every value",
                message=f"{what} {origin}: missing required key 'sources.{name}' (where the value "
                f"of {name!r} comes from)",
            )


def fail(origin: str, what: str, key: str, value: object, allowed: str) -> NoReturn:
    """Raise the one-line refusal '<what> <origin>: <key>=<value> is invalid: allowed <allowed>'."""
    raise ConfigError(
        key,
        value,
        allowed,
        message=f"{what} {origin}: {key}={_shown(value)} is invalid: allowed {allowed}",
    )


def _shown(value: object) -> str:
    shown = repr(value).replace("\n", " ")
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 3] + "..."


def reference_table(fields: Mapping[str, Field], *, prefix: str = "") -> str:
    """The keys of `fields` as a Markdown table (key, JSON type and allowed values, required or
    default, meaning); the keys of nested declared objects follow as 'outer.inner' rows."""
    rows = ["| key | allowed | required / default | meaning |", "|---|---|---|---|"]
    rows += _reference_rows(fields, prefix)
    return "\n".join(rows)


def _reference_rows(fields: Mapping[str, Field], prefix: str) -> list[str]:
    rows = []
    for name, field in fields.items():
        presence = "required" if field.required else "optional"
        if not field.required and field.default is not None:
            presence += f", default {_json(field.default)}"
        presence += ", sourced" if field.sourced else ""
        allowed = describe(field).replace("|", "\\|")
        doc = field.doc.replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {allowed} | {presence} | {doc} |")
        if field.kind == "object" and field.fields is not None:
            rows += _reference_rows(field.fields, f"{prefix}{name}.")
    return rows


def _json(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
