"""Read and validate storage profiles and the reliability defaults (the boundary where JSON becomes a
StorageProfile / ReliabilityDefaults).

Every key is declared once below with its kind and range; an unknown key, a missing key, a wrong type
or an out-of-range value is one ConfigError naming the file and the key, and every number (and every
null that stands for "not a limit") must be explained in the file's `sources` object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NoReturn

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


@dataclass(frozen=True, kw_only=True, slots=True)
class _Key:
    kind: str
    """'str', 'rate', 'GBps' (number or null), 'seconds', 'mode', 'sources'."""
    high: float | None = None


_STORAGE_KEYS = {
    "schema_version": _Key(kind="str"),
    "name": _Key(kind="str"),
    "description": _Key(kind="str"),
    "write_GBps_aggregate": _Key(kind="GBps", high=MAX_GBPS),
    "read_GBps_aggregate": _Key(kind="GBps", high=MAX_GBPS),
    "write_GBps_per_node": _Key(kind="GBps", high=MAX_GBPS),
    "read_GBps_per_node": _Key(kind="GBps", high=MAX_GBPS),
    "sources": _Key(kind="sources"),
}
_DEFAULT_KEYS = {
    "schema_version": _Key(kind="str"),
    "failure_rate_per_gpu_hour": _Key(kind="rate", high=MAX_RATE_PER_HOUR),
    "failure_rate_per_node_hour": _Key(kind="rate", high=MAX_RATE_PER_HOUR),
    "restart_overhead_s": _Key(kind="seconds", high=MAX_RESTART_S),
    "storage": _Key(kind="str"),
    "checkpoint": _Key(kind="mode"),
    "sources": _Key(kind="sources"),
}
_SOURCED = ("GBps", "rate", "seconds", "mode")


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
    _check(data, _STORAGE_KEYS, origin, "storage profile")
    return StorageProfile(
        **{k: (float(v) if _is_number(v) else v) for k, v in data.items() if k != "schema_version"}
    )


@lru_cache(maxsize=1)
def load_reliability_defaults() -> ReliabilityDefaults:
    path = STORAGE_DIR / DEFAULTS_FILE
    return defaults_from_dict(read_json(path, "reliability defaults"), origin=str(path))


def defaults_from_dict(data: object, *, origin: str = "<dict>") -> ReliabilityDefaults:
    _check(data, _DEFAULT_KEYS, origin, "reliability defaults")
    if data["storage"] not in available_storage():
        _fail(
            origin,
            "reliability defaults",
            "storage",
            data["storage"],
            "one of " + ", ".join(available_storage()),
        )
    return ReliabilityDefaults(
        **{k: (float(v) if _is_number(v) else v) for k, v in data.items() if k != "schema_version"}
    )


def _check(data: object, keys: dict[str, _Key], origin: str, what: str) -> None:
    if not isinstance(data, dict):
        _fail(origin, what, "<document>", data, "a JSON object")
    unknown = sorted(set(data) - set(keys))
    if unknown:
        _fail(
            origin,
            what,
            unknown[0],
            data[unknown[0]],
            "no such key; allowed keys: " + ", ".join(keys),
        )
    for key, spec in keys.items():
        if key not in data:
            raise ConfigError(
                key, None, "present", message=f"{what} {origin}: missing required key {key!r}"
            )
        _check_value(origin, what, key, data[key], spec)
    if data["schema_version"] != SCHEMA_VERSION:
        _fail(origin, what, "schema_version", data["schema_version"], repr(SCHEMA_VERSION))
    sources = data["sources"]
    for key, spec in keys.items():
        if spec.kind in _SOURCED and not (
            isinstance(sources.get(key), str) and sources[key].strip()
        ):
            raise ConfigError(
                f"sources.{key}",
                None,
                "a source for every value",
                message=f"{what} {origin}: missing required key 'sources.{key}' (where the value "
                f"of {key!r} comes from)",
            )


def _check_value(origin: str, what: str, key: str, value: object, spec: _Key) -> None:
    if spec.kind == "str":
        if not isinstance(value, str) or not value.strip():
            _fail(origin, what, key, value, "a non-empty string")
    elif spec.kind == "mode":
        if value not in CHECKPOINT_MODES:
            _fail(origin, what, key, value, "one of " + ", ".join(CHECKPOINT_MODES))
    elif spec.kind == "sources":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            _fail(origin, what, key, value, "an object mapping keys to source descriptions")
    else:
        if value is None and spec.kind == "GBps":
            return
        if not _is_number(value) or not math.isfinite(value) or not 0 < value <= spec.high:
            unit = {"GBps": "GB/s", "rate": "per hour", "seconds": "s"}[spec.kind]
            allowed = f"a number > 0 and <= {spec.high:g} ({unit})" + (
                ", or null (not a limit)" if spec.kind == "GBps" else ""
            )
            _fail(origin, what, key, value, allowed)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fail(origin: str, what: str, key: str, value: object, allowed: str) -> NoReturn:
    shown = repr(value).replace("\n", " ")
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ConfigError(
        key, value, allowed, message=f"{what} {origin}: {key}={shown} is invalid: allowed {allowed}"
    )
