"""docs/data-files.md is the rendering of the declared data-file schemas (so it cannot drift from
what the loaders accept), and it documents every key the loaders and the row check declare."""

from __future__ import annotations

from benchmarks.data_files_doc import DOC, render
from benchmarks.published_schema import EXTRAS, ROW
from frameworks.loader import FRAMEWORK_KEYS
from frameworks.profile import CAPABILITY_FIELDS
from hardware_profiles.efficiency import EFFICIENCY_KEYS
from hardware_profiles.loader import KEYS
from storage_profiles.loader import DEFAULT_KEYS, STORAGE_KEYS


def test_the_committed_doc_is_the_rendering():
    assert DOC.read_text(encoding="utf-8") == render(), (
        "re-render: python -m benchmarks.data_files_doc --write"
    )


def test_every_declared_key_has_a_row():
    text = DOC.read_text(encoding="utf-8")
    keys = [
        *KEYS,
        *(f"efficiency.{k}" for k in EFFICIENCY_KEYS),
        *STORAGE_KEYS,
        *DEFAULT_KEYS,
        *FRAMEWORK_KEYS,
        *(f"capabilities.{k}" for k in CAPABILITY_FIELDS),
        *ROW,
        *(f"extras.{k}" for k in EXTRAS),
    ]
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, missing


def test_a_required_and_a_defaulted_key_read_as_such():
    text = DOC.read_text(encoding="utf-8")
    assert (
        "| `devices_per_node` | an integer >= 1 and <= 1024 (devices) | required, sourced |" in text
    )
    assert "| `capabilities.uneven_stages` | true or false | optional, default true |" in text
