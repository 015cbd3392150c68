"""Read and validate hardware profile files (the boundary where JSON becomes a HardwareProfile).

Every key is declared once in `KEYS` (planner.data_schema.Field: its type, whether it is required,
its sane range, its unit, what it means); an unknown key, a missing key, a wrong type or an
out-of-range value raises one ConfigError whose single-line message names the file and the key
(planner.data_schema.check_document), and docs/data-files.md is rendered from the same table. Every number in a file must have an entry in its
`sources` object (the data is only as good as its provenance).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from hardware_profiles.profile import HardwareProfile
from hardware_profiles.efficiency import check_efficiency
from planner.data_schema import Field, check_document, check_sources, describe, fail
from planner.errors import ConfigError
from planner.io import check_writable, read_json_if_exists, special_kind
from planner.io import read_json

PROFILE_DIR = Path(__file__).resolve().parent
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
"""Math dtypes a profile may give a peak for; mxfp8 is FP8 with E8M0 block scales on block-scaled
tensor cores (Blackwell's kind::mxf8f6f4 MMA), where an FP8 recipe's MXFP8 scaling runs; nvfp4 is
FP4 E2M1 with E4M3 scales per 16 elements (Blackwell's kind::mxf4nvf4 MMA), where the NVFP4 recipe's
GEMMs run."""
SCHEMA_VERSION = "1"


def _positive(doc: str, high: float, unit: str, **more) -> Field:
    """A sourced number > 0 and <= `high`."""
    return Field(
        kind="number", low=0, low_open=True, high=high, unit=unit, sourced=True, doc=doc, **more
    )


def _count(doc: str, high: float, unit: str, **more) -> Field:
    """A sourced integer >= 1 and <= `high`."""
    return Field(kind="int", low=1, high=high, unit=unit, sourced=True, doc=doc, **more)


def _price(doc: str, *, required: bool) -> Field:
    return Field(
        kind="number",
        required=required,
        nullable=True,
        null_means="not sold so",
        low=0,
        high=1e4,
        unit="USD/h",
        sourced=True,
        doc=doc,
    )


PEAK_TFLOPS = {
    dtype: _positive(
        f"Dense peak {dtype} TFLOP/s (datasheet).", 1e5, "TFLOP/s", required=dtype == "fp32"
    )
    for dtype in DTYPES
}
"""The `peak_tflops` block: fp32 always, the other math dtypes where the device has them."""

KEYS: dict[str, Field] = {
    "schema_version": Field(kind="str", required=False, doc="File format version ('1')."),
    "name": Field(kind="str", nonempty=True, doc="Profile name, e.g. 'p4d.24xlarge'."),
    "description": Field(kind="str", required=False, doc="One line saying what the machine is."),
    "device": Field(
        kind="str", nonempty=True, doc="Accelerator model, e.g. 'NVIDIA A100-SXM4-40GB'."
    ),
    "devices_per_node": _count("Accelerators per node.", 1024, "devices"),
    "nvlink_domain": _count(
        "Devices joined by the fast fabric when it spans nodes (GB200 NVL72: 72).",
        100_000,
        "devices",
        required=False,
        nullable=True,
        null_means="the node",
    ),
    "memory_bytes": Field(
        kind="int",
        low=2**20,
        high=2**45,
        unit="bytes",
        sourced=True,
        doc="Device memory the framework can allocate (usable, not the marketing number).",
    ),
    "memory_bandwidth_GBps": _positive(
        "Device-memory bandwidth a large copy achieves (read + write bytes / s).", 1e5, "GB/s"
    ),
    "memory_bandwidth_peak_GBps": _positive(
        "Datasheet device-memory bandwidth.", 1e5, "GB/s", required=False, nullable=True
    ),
    "peak_tflops": Field(
        kind="object",
        fields=PEAK_TFLOPS,
        sourced=True,
        doc="Dense peak TFLOP/s by math dtype (" + ", ".join(DTYPES) + ").",
    ),
    "intra_node_interconnect": Field(
        kind="str", required=False, doc="Intra-node fabric, e.g. 'NVLink 3 via NVSwitch'."
    ),
    "intra_node_GBps_per_device": _positive(
        "Unidirectional NVLink/NVSwitch (or PCIe) bandwidth per device inside a node.", 1e4, "GB/s"
    ),
    "intra_node_latency_us": _positive(
        "Per-message latency of an intra-node collective step.", 1e5, "us"
    ),
    "inter_node_interconnect": Field(
        kind="str", required=False, doc="Network, e.g. 'EFA' or 'InfiniBand HDR'."
    ),
    "nics_per_node": _count("Network interfaces used for training traffic per node.", 256, "NICs"),
    "Gbps_per_nic": _positive("Line rate of one NIC.", 1e5, "Gbit/s"),
    "inter_node_Gbps_per_node": _positive(
        "Network bandwidth out of one node: nics_per_node x Gbps_per_nic (checked).", 1e6, "Gbit/s"
    ),
    "inter_node_latency_us": _positive(
        "Per-message latency of an inter-node collective step.", 1e6, "us"
    ),
    "host_device_GBps": _positive(
        "Host<->device bandwidth per device for offload (PCIe).", 1e4, "GB/s"
    ),
    "price_usd_per_hour": _price("On-demand price of one node.", required=True),
    "spot_price_usd_per_hour": _price("Spot price of one node, where known.", required=False),
    "efficiency": Field(
        kind="object",
        doc="Physical efficiency parameters, each declared in hardware_profiles/efficiency.py "
        "(EFFICIENCY_KEYS: unit, range, default; see below).",
    ),
    "sources": Field(kind="strings", doc="Where each number comes from, by key (every one)."),
    "calibration": Field(
        kind="object",
        required=False,
        doc="Raw measurements and fitted models written by `planner hardware calibrate`.",
    ),
}
"""Every top-level key of a profile file (planner.data_schema: kind, range, unit, meaning)."""
WHAT = "hardware profile"

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


def _check_block_scaled_fp8(origin: str, peaks: dict) -> None:
    """peak_tflops.mxfp8 states block-scaled FP8 tensor cores; the cost model runs MXFP8 GEMMs at
    the fp8 rate (every Blackwell datasheet gives one rate for both), so the two must agree."""
    if "mxfp8" in peaks and peaks.get("fp8") != peaks["mxfp8"]:
        raise ConfigError(
            "peak_tflops.mxfp8",
            peaks["mxfp8"],
            f"the fp8 peak ({peaks.get('fp8')}): MXFP8 GEMMs are costed at the fp8 rate",
            message=f"{origin}: peak_tflops.mxfp8={peaks['mxfp8']} must equal peak_tflops.fp8 "
            f"({peaks.get('fp8')}): the cost model runs MXFP8 GEMMs at the fp8 rate",
        )


def _check_block_scaled_fp4(origin: str, peaks: dict) -> None:
    """peak_tflops.nvfp4 states FP4 tensor cores with 16-element E4M3 block scales: the block-scaled
    MMA of the same generation as MXFP8's (Blackwell), at no less than the fp8 rate (the datasheets
    give 2x on Blackwell, 3x on Blackwell Ultra)."""
    if "nvfp4" not in peaks:
        return
    if "mxfp8" not in peaks or peaks["nvfp4"] < peaks.get("fp8", 0.0):
        raise ConfigError(
            "peak_tflops.nvfp4",
            peaks["nvfp4"],
            "a rate beside peak_tflops.mxfp8, at least the fp8 peak",
            message=f"{origin}: peak_tflops.nvfp4={peaks['nvfp4']} needs block-scaled tensor "
            f"cores (peak_tflops.mxfp8) and at least the fp8 peak ({peaks.get('fp8')})",
        )


def profile_from_dict(data: object, *, origin: str = "<dict>") -> HardwareProfile:
    """Validate a decoded profile document and build the record; `origin` names it in errors. A
    document with `refines` takes the efficiency keys it does not set from that shipped profile
    (`refined_document`)."""
    if isinstance(data, dict) and REFINES in data:
        data = refined_document(data, origin)
    check_document(data, KEYS, origin, WHAT)
    check_efficiency(data["efficiency"], origin)
    _check_network(origin, data)
    _check_block_scaled_fp8(origin, data["peak_tflops"])
    _check_block_scaled_fp4(origin, data["peak_tflops"])
    check_sources(data, KEYS, origin, WHAT)
    kwargs = {k: v for k, v in data.items() if k != "schema_version"}
    for key, field in KEYS.items():
        if field.kind == "number" and kwargs.get(key) is not None:
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
        fail(origin, WHAT, REFINES, name, "the name of a shipped profile: " + ", ".join(shipped))
    base = read_json(PROFILE_DIR / f"{name}.json", "hardware profile")
    own = data.get("efficiency", {})
    if not isinstance(own, dict):
        fail(origin, WHAT, "efficiency", own, describe(KEYS["efficiency"]))
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        fail(origin, WHAT, "sources", sources, describe(KEYS["sources"]))
    inherited = sorted(set(base["efficiency"]) - set(own))
    quoted = (
        f"inherited from the shipped {name} profile ({', '.join(inherited)}): "
        + base["sources"]["efficiency"]
    )
    mine = sources.get("efficiency")
    if own and not (isinstance(mine, str) and mine.strip()):
        raise ConfigError(
            "sources.efficiency",
            None,
            "a source for the efficiency keys the file sets",
            message=f"hardware profile {origin}: missing required key 'sources.efficiency' "
            f"(where its own efficiency keys {', '.join(sorted(own))} come from)",
        )
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


def _check_network(origin: str, data: dict) -> None:
    """The node's network rate is its NICs times their rate (within 1%)."""
    nics, per_nic, total = (
        data["nics_per_node"],
        data["Gbps_per_nic"],
        data["inter_node_Gbps_per_node"],
    )
    if abs(nics * per_nic - total) > 0.01 * total:
        fail(
            origin,
            WHAT,
            "inter_node_Gbps_per_node",
            total,
            f"nics_per_node({nics}) x Gbps_per_nic({per_nic:g}) = {nics * per_nic:g}",
        )


def previous_profile(out: str | Path, what: str = "--out") -> dict | None:
    """The hardware profile already at `out` (calibrate keeps its efficiency keys), None when there
    is none; one ConfigError line when `out` cannot be written or holds something other than a
    hardware profile (a FIFO, a device, malformed JSON, another document). Standard library and
    planner.io only: `planner hardware calibrate` runs it before anything heavy loads
    (planner.__main__.early_refusal) and again before it measures. A profile that `refines` a
    shipped one comes back resolved (`refined_document`): the calibration keeps the efficiency keys
    it inherited too, and writes a profile that stands alone."""
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
        if REFINES in previous:
            previous = refined_document(previous, str(out))
    return previous
