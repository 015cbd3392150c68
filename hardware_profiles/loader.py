"""Read and validate hardware profile files (the boundary where JSON becomes a HardwareProfile).

Every key is declared once in `KEYS` with its type, whether it is required, and its sane range;
an unknown key, a missing key, a wrong type or an out-of-range value raises one ConfigError whose
single-line message names the file and the key. Every number in a file must have an entry in its
`sources` object (the data is only as good as its provenance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NoReturn

from hardware_profiles.profile import HardwareProfile
from hardware_profiles.efficiency import check_efficiency
from planner.errors import ConfigError
from planner.io import check_writable, read_json_if_exists, special_kind
from planner.io import read_json

PROFILE_DIR = Path(__file__).resolve().parent
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
SCHEMA_VERSION = "1"


@dataclass(frozen=True, kw_only=True, slots=True)
class KeySpec:
    """What one top-level key of a profile file may hold."""

    kind: str
    """'str', 'int', 'number', 'tflops' (dtype -> number), 'numbers' (free object), 'strings', 'object'."""
    required: bool = True
    nullable: bool = False
    """null allowed (e.g. no on-demand price)."""
    low: float | None = None
    """Smallest allowed value (inclusive unless `low_open`)."""
    low_open: bool = False
    high: float | None = None
    """Largest allowed value (inclusive)."""
    unit: str = ""
    """Shown in error messages."""


KEYS: dict[str, KeySpec] = {
    "schema_version": KeySpec(kind="str", required=False),
    "name": KeySpec(kind="str"),
    "description": KeySpec(kind="str", required=False),
    "device": KeySpec(kind="str"),
    "devices_per_node": KeySpec(kind="int", low=1, high=1024, unit="devices"),
    "nvlink_domain": KeySpec(
        kind="int", required=False, nullable=True, low=1, high=100_000, unit="devices"
    ),
    "memory_bytes": KeySpec(kind="int", low=2**20, high=2**45, unit="bytes"),
    "memory_bandwidth_GBps": KeySpec(kind="number", low=0, low_open=True, high=1e5, unit="GB/s"),
    "memory_bandwidth_peak_GBps": KeySpec(
        kind="number", required=False, nullable=True, low=0, low_open=True, high=1e5, unit="GB/s"
    ),
    "peak_tflops": KeySpec(kind="tflops", low=0, low_open=True, high=1e5, unit="TFLOP/s"),
    "intra_node_interconnect": KeySpec(kind="str", required=False),
    "intra_node_GBps_per_device": KeySpec(
        kind="number", low=0, low_open=True, high=1e4, unit="GB/s"
    ),
    "intra_node_latency_us": KeySpec(kind="number", low=0, low_open=True, high=1e5, unit="us"),
    "inter_node_interconnect": KeySpec(kind="str", required=False),
    "nics_per_node": KeySpec(kind="int", low=1, high=256, unit="NICs"),
    "Gbps_per_nic": KeySpec(kind="number", low=0, low_open=True, high=1e5, unit="Gbit/s"),
    "inter_node_Gbps_per_node": KeySpec(
        kind="number", low=0, low_open=True, high=1e6, unit="Gbit/s"
    ),
    "inter_node_latency_us": KeySpec(kind="number", low=0, low_open=True, high=1e6, unit="us"),
    "host_device_GBps": KeySpec(kind="number", low=0, low_open=True, high=1e4, unit="GB/s"),
    "price_usd_per_hour": KeySpec(kind="number", nullable=True, low=0, high=1e4, unit="USD/h"),
    "spot_price_usd_per_hour": KeySpec(
        kind="number", required=False, nullable=True, low=0, high=1e4, unit="USD/h"
    ),
    "efficiency": KeySpec(kind="numbers"),
    "sources": KeySpec(kind="strings"),
    "calibration": KeySpec(kind="object", required=False),
}

_RECORD_FIELDS = {f.name for f in fields(HardwareProfile)}
assert set(KEYS) - {"schema_version"} <= _RECORD_FIELDS, (
    "every file key must be a HardwareProfile field"
)


def available_profiles() -> list[str]:
    """Names of the profiles shipped beside this module, sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def resolve_profile_path(name_or_path: str) -> Path:
    """A shipped profile's file by name, or the given path; ConfigError listing the names otherwise."""
    text = str(name_or_path)
    by_name = PROFILE_DIR / f"{text}.json"
    if "/" not in text and "\\" not in text and by_name.is_file():
        return by_name
    path = Path(text).expanduser()
    if path.is_file() or special_kind(path):  # a FIFO or a device: read_json names what it is
        return path
    if text.endswith(".json") or "/" in text:
        raise ConfigError(
            "hardware",
            text,
            "a name among "
            + ", ".join(available_profiles())
            + " or the path of an existing profile JSON file",
            message=f"hardware={text!r}: no such profile file; allowed a name among "
            + ", ".join(available_profiles())
            + " or the path of an existing JSON file",
        )
    raise ConfigError(
        "hardware",
        text,
        "one of " + ", ".join(available_profiles()) + ", or a path to a profile JSON file",
    )


def load_profile(name_or_path: str) -> HardwareProfile:
    """Read, validate and return one profile (by shipped name or by path)."""
    path = resolve_profile_path(name_or_path)
    data = read_json(path, "hardware profile")
    return profile_from_dict(data, origin=str(path))


def profile_from_dict(data: object, *, origin: str = "<dict>") -> HardwareProfile:
    """Validate a decoded profile document and build the record; `origin` names it in errors. A
    document with `refines` takes the efficiency keys it does not set from that shipped profile
    (`refined_document`)."""
    if not isinstance(data, dict):
        _fail(origin, "<document>", data, "a JSON object with the profile keys")
    if REFINES in data:
        data = refined_document(data, origin)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        _fail(
            origin,
            unknown[0],
            data[unknown[0]],
            "no such key; allowed keys: " + ", ".join(KEYS),
            what="unknown key",
        )
    for key, spec in KEYS.items():
        if key not in data:
            if spec.required:
                raise ConfigError(
                    key,
                    None,
                    _describe(spec),
                    message=f"hardware profile {origin}: missing required key {key!r} "
                    f"({_describe(spec)})",
                )
            continue
        _check_value(origin, key, data[key], spec)
    _check_consistency(origin, data)
    kwargs = {k: v for k, v in data.items() if k != "schema_version"}
    for key in (
        "memory_bandwidth_GBps",
        "intra_node_GBps_per_device",
        "intra_node_latency_us",
        "Gbps_per_nic",
        "inter_node_Gbps_per_node",
        "inter_node_latency_us",
        "host_device_GBps",
        "memory_bandwidth_peak_GBps",
        "price_usd_per_hour",
        "spot_price_usd_per_hour",
    ):
        if kwargs.get(key) is not None:
            kwargs[key] = float(kwargs[key])
    kwargs["peak_tflops"] = {k: float(v) for k, v in data["peak_tflops"].items()}
    return HardwareProfile(**kwargs)


REFINES = "refines"
"""The key of a profile that refines a shipped one: a cluster of the same GPU generation whose node
facts (memory, network, host links) are its own and whose kernel efficiencies are its generation's
(validation/hardware/clusters; a user's own cluster file)."""


def refined_document(data: dict, origin: str) -> dict:
    """The document of a profile that refines the shipped profile `data["refines"]`: its own keys,
    with the efficiency keys it does not set taken from that profile, and their provenance quoted
    from it. Only the efficiency block is inherited: every node fact the file states is its own, so
    a missing one is still a missing key."""
    name = data[REFINES]
    shipped = available_profiles()
    if not isinstance(name, str) or name not in shipped:
        _fail(origin, REFINES, name, "the name of a shipped profile: " + ", ".join(shipped))
    base = read_json(PROFILE_DIR / f"{name}.json", "hardware profile")
    own = data.get("efficiency", {})
    if not isinstance(own, dict):
        _fail(origin, "efficiency", own, _describe(KEYS["efficiency"]))
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        _fail(origin, "sources", sources, _describe(KEYS["sources"]))
    inherited = sorted(set(base["efficiency"]) - set(own))
    quoted = (
        f"inherited from the shipped {name} profile ({', '.join(inherited)}): "
        + base["sources"]["efficiency"]
    )
    mine = sources.get("efficiency")
    out = {k: v for k, v in data.items() if k != REFINES}
    out["efficiency"] = {**base["efficiency"], **own}
    out["sources"] = {**sources, "efficiency": f"{mine}; {quoted}" if mine else quoted}
    return out


def profile_to_dict(profile: HardwareProfile) -> dict:
    """The file form of a profile (round-trips through `profile_from_dict`)."""
    out: dict = {"schema_version": SCHEMA_VERSION}
    for key in KEYS:
        if key == "schema_version":
            continue
        value = getattr(profile, key)
        if value is None and not KEYS[key].required:
            continue
        if key == "calibration" and not value:
            continue
        out[key] = value
    return out


def _check_value(origin: str, key: str, value: object, spec: KeySpec) -> None:
    if value is None:
        if not spec.nullable:
            _fail(origin, key, value, _describe(spec))
        return
    if spec.kind == "str":
        if not isinstance(value, str) or (key in ("name", "device") and not value.strip()):
            _fail(
                origin,
                key,
                value,
                "a non-empty string" if key in ("name", "device") else "a string",
            )
    elif spec.kind in ("int", "number"):
        _check_number(origin, key, value, spec)
    elif spec.kind == "tflops":
        if not isinstance(value, dict) or not value:
            _fail(
                origin,
                key,
                value,
                "an object mapping dtypes (" + ", ".join(DTYPES) + ") to TFLOP/s",
            )
        for dtype, rate in value.items():
            if dtype not in DTYPES:
                _fail(
                    origin,
                    f"{key}.{dtype}",
                    rate,
                    "dtypes among " + ", ".join(DTYPES),
                    what="unknown key",
                )
            _check_number(origin, f"{key}.{dtype}", rate, spec)
        if "fp32" not in value:
            raise ConfigError(
                f"{key}.fp32",
                None,
                "a positive number",
                message=f"hardware profile {origin}: missing required key '{key}.fp32'",
            )
    elif spec.kind == "numbers":
        check_efficiency(value, origin)
    elif spec.kind == "strings":
        if not isinstance(value, dict):
            _fail(origin, key, value, "an object mapping keys to source descriptions")
        for name, text in value.items():
            if not isinstance(text, str) or not text.strip():
                _fail(origin, f"{key}.{name}", text, "a non-empty string")
    elif spec.kind == "object":
        if not isinstance(value, dict):
            _fail(origin, key, value, "a JSON object")
    else:  # pragma: no cover - KEYS is static
        raise AssertionError(spec.kind)


def _check_number(origin: str, key: str, value: object, spec: KeySpec) -> None:
    if spec.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        _fail(origin, key, value, _describe(spec))
    if not _is_number(value) or not math.isfinite(value):
        _fail(origin, key, value, _describe(spec))
    too_low = spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low)
    too_high = spec.high is not None and value > spec.high
    if too_low or too_high:
        _fail(origin, key, value, _describe(spec))


def _check_consistency(origin: str, data: dict) -> None:
    """Cross-key facts: the node's network rate is its NICs times their rate; every number is sourced."""
    nics, per_nic, total = (
        data["nics_per_node"],
        data["Gbps_per_nic"],
        data["inter_node_Gbps_per_node"],
    )
    if abs(nics * per_nic - total) > 0.01 * total:
        _fail(
            origin,
            "inter_node_Gbps_per_node",
            total,
            f"nics_per_node({nics}) x Gbps_per_nic({per_nic:g}) = {nics * per_nic:g}",
        )
    sources = data["sources"]
    for key, spec in KEYS.items():
        if (
            spec.kind in ("int", "number", "tflops")
            and data.get(key) is not None
            and key not in sources
        ):
            raise ConfigError(
                f"sources.{key}",
                None,
                "a source for every number",
                message=f"hardware profile {origin}: missing required key 'sources.{key}' "
                f"(where the value of {key!r} comes from)",
            )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(spec: KeySpec) -> str:
    kind = {
        "int": "an integer",
        "number": "a number",
        "tflops": "TFLOP/s values",
        "str": "a string",
        "numbers": "an object of named numbers",
        "strings": "an object of strings",
        "object": "a JSON object",
    }[spec.kind]
    if spec.low is not None and spec.high is not None:
        lower = ">" if spec.low_open else ">="
        kind += f" {lower} {spec.low:g} and <= {spec.high:g}"
    if spec.unit:
        kind += f" ({spec.unit})"
    if spec.nullable:
        kind += ", or null"
    return kind


def _fail(origin: str, key: str, value: object, allowed: str, *, what: str = "") -> NoReturn:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    shown = shown.replace("\n", " ")
    label = f"{what} {key!r}" if what else f"{key}={shown}"
    raise ConfigError(
        key,
        value,
        allowed,
        message=f"hardware profile {origin}: {label} is invalid: allowed {allowed}",
    )


def previous_profile(out: str | Path, what: str = "--out") -> dict | None:
    """The hardware profile already at `out` (calibrate keeps its efficiency keys), None when there
    is none; one ConfigError line when `out` cannot be written or holds something other than a
    hardware profile (a FIFO, a device, malformed JSON, another document). Standard library and
    planner.io only: `planner hardware calibrate` runs it before anything heavy loads
    (planner.__main__.early_refusal) and again before it measures."""
    check_writable(out, what)
    previous = read_json_if_exists(out, what)
    if previous is not None:
        try:
            profile_from_dict(previous, origin=str(out))
        except ConfigError as err:
            raise ConfigError(
                what,
                str(out),
                "a new file or a hardware profile",
                message=(
                    f"{what} {out}: exists and is not a hardware profile ({err}); calibrate "
                    f"replaces only a profile: choose another {what} or move the file"
                ),
            ) from None
    return previous
