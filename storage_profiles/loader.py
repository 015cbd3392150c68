"""Read and validate storage profiles and the reliability defaults (the boundary where JSON becomes a
StorageProfile / ReliabilityDefaults).

Every key is declared once below (planner.data_schema.Field: kind, range, unit, meaning; the same
declarations render docs/data-files.md); an unknown key, a missing key, a wrong type
or an out-of-range value is one ConfigError naming the file and the key, and every number (and every
null that stands for "not a limit") must be explained in the file's `sources` object.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from planner.data_schema import Field, check_document, check_sources, fail
from planner.errors import ConfigError
from storage_profiles.profile import CHECKPOINT_MODES, ReliabilityDefaults, StorageProfile
from planner.io import read_json

STORAGE_DIR = Path(__file__).resolve().parent
DEFAULTS_FILE = "reliability_defaults.json"
SCHEMA_VERSION = "1"
MAX_GBPS = 1e5
"""Largest bandwidth a file may state, GB/s: 14x the 7 TB/s peak of the storage behind Llama 3's 16K
GPUs (Grattafiori et al. 2024, Sec. 3.3.1)."""
MAX_RATE_PER_HOUR = 1.0
"""Largest failure rate per GPU- or node-hour: one interruption per hour from every single part."""
MAX_RESTART_S = 7 * 86400.0
"""Longest restart overhead: a week."""


def _bandwidth(doc: str, null_means: str) -> Field:
    return Field(
        kind="number",
        nullable=True,
        null_means=null_means,
        low=0,
        low_open=True,
        high=MAX_GBPS,
        unit="GB/s",
        sourced=True,
        doc=doc,
    )


def _rate(doc: str) -> Field:
    return Field(
        kind="number",
        low=0,
        low_open=True,
        high=MAX_RATE_PER_HOUR,
        unit="per hour",
        sourced=True,
        doc=doc,
    )


_VERSION = Field(kind="str", allowed=(SCHEMA_VERSION,), doc="File format version.")
_SOURCES = Field(kind="strings", doc="Where each value (and each null) comes from, by key.")
STORAGE_KEYS = {
    "schema_version": _VERSION,
    "name": Field(kind="str", nonempty=True, doc="Profile name (the file's name when shipped)."),
    "description": Field(kind="str", nonempty=True, doc="One line saying what the storage is."),
    "write_GBps_aggregate": _bandwidth(
        "Bandwidth of the storage service for all writers together.", "not a limit"
    ),
    "read_GBps_aggregate": _bandwidth("Bandwidth for all readers together.", "not a limit"),
    "write_GBps_per_node": _bandwidth(
        "One node's write bandwidth to the service.", "the node's network is the limit"
    ),
    "read_GBps_per_node": _bandwidth(
        "One node's read bandwidth.", "the node's network is the limit"
    ),
    "sources": _SOURCES,
}
"""Every key of a storage profile file (planner.data_schema)."""
DEFAULT_KEYS = {
    "schema_version": _VERSION,
    "failure_rate_per_gpu_hour": _rate("Job interruptions caused by one GPU, per GPU-hour."),
    "failure_rate_per_node_hour": _rate(
        "Job interruptions caused by one node's other parts (host, network, software)."
    ),
    "restart_overhead_s": Field(
        kind="number",
        low=0,
        low_open=True,
        high=MAX_RESTART_S,
        unit="s",
        sourced=True,
        doc="From a failure until training runs again, checkpoint read excluded.",
    ),
    "storage": Field(
        kind="str", nonempty=True, sourced=True, doc="The default storage profile's name."
    ),
    "checkpoint": Field(
        kind="str", allowed=CHECKPOINT_MODES, sourced=True, doc="The default save mode."
    ),
    "sources": _SOURCES,
}
"""Every key of storage_profiles/reliability_defaults.json (planner.data_schema)."""
STORAGE = "storage profile"
DEFAULTS = "reliability defaults"


def available_storage() -> list[str]:
    """Names of the storage profiles shipped beside this module, sorted."""
    return sorted(p.stem for p in STORAGE_DIR.glob("*.json") if p.name != DEFAULTS_FILE)


def _path_of(name_or_path: str) -> Path:
    text = str(name_or_path)
    by_name = STORAGE_DIR / f"{text}.json"
    if "/" not in text and "\\" not in text and not text.endswith(".json"):
        if text in available_storage():
            return by_name
        if Path(text).is_file():
            return Path(text)
        raise ConfigError(
            "storage",
            text,
            "one of "
            + ", ".join(available_storage())
            + ", or a path to a storage profile JSON file",
        )
    return Path(text).expanduser()


@lru_cache(maxsize=32)
def load_storage(name_or_path: str) -> StorageProfile:
    """A shipped storage profile by name or a storage profile file by path."""
    path = _path_of(name_or_path)
    data = read_json(path, "storage profile")
    return storage_from_dict(data, origin=str(path))


def storage_from_dict(data: object, *, origin: str = "<dict>") -> StorageProfile:
    """Validate a decoded storage profile and build the record; `origin` names it in errors."""
    check_document(data, STORAGE_KEYS, origin, STORAGE)
    check_sources(data, STORAGE_KEYS, origin, STORAGE, nulls=True)
    return StorageProfile(
        **{k: (float(v) if _is_number(v) else v) for k, v in data.items() if k != "schema_version"}
    )


@lru_cache(maxsize=1)
def load_reliability_defaults() -> ReliabilityDefaults:
    path = STORAGE_DIR / DEFAULTS_FILE
    return defaults_from_dict(read_json(path, "reliability defaults"), origin=str(path))


def defaults_from_dict(data: object, *, origin: str = "<dict>") -> ReliabilityDefaults:
    check_document(data, DEFAULT_KEYS, origin, DEFAULTS)
    check_sources(data, DEFAULT_KEYS, origin, DEFAULTS)
    if data["storage"] not in available_storage():
        fail(
            origin,
            DEFAULTS,
            "storage",
            data["storage"],
            "one of " + ", ".join(available_storage()),
        )
    return ReliabilityDefaults(
        **{k: (float(v) if _is_number(v) else v) for k, v in data.items() if k != "schema_version"}
    )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
