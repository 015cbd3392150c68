"""Every published validation run names a hardware profile that exists and describes its GPU.

Files: validation/hardware/clusters/*.json (profiles of the clusters the publications ran on, format of
hardware_profiles/*.json, provenance in validation/hardware/clusters/README.md) and every row of
validation/published/*.json (`runs`, and `reference_only` where a file has it), and the profiles
vTrain's rows are predicted on (benchmarks/accuracy_vtrain.py).

Properties checked: each cluster file loads through `hardware_profiles.load_profile` and is named after
its file; it refines the shipped profile of its GPU generation and sets no efficiency key of that
profile's (nothing fitted or copied here: the block is inherited, hardware_profiles.loader.refined_document);
each row's `hardware` is a shipped profile name or a cluster file; the profile's device is the GPU the
row names (model, and memory size where the row gives one); the facts the cluster README states hold.
The GPU matcher is exercised on mismatching pairs so that a matcher accepting everything fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.accuracy_vtrain import HARDWARE as VTRAIN_HARDWARE
from benchmarks.calibrate import CLUSTER_KEYS
from hardware_profiles import HardwareProfile, available_profiles, load_profile

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "validation" / "published"
CLUSTER_DIR = ROOT / "validation" / "hardware" / "clusters"
CLUSTER_FILES = sorted(CLUSTER_DIR.glob("*.json"))
SHIPPED = set(available_profiles())
CLUSTERS = {p.stem for p in CLUSTER_FILES}

_MODEL = re.compile(r"(?<![A-Z0-9])(GB300|GB200|B300|B200|H200|H800|H100|A100|V100)(?![0-9])")
_MEMORY = re.compile(r"(?<![0-9])(\d{2,3})\s*GB")

GENERATION_REFERENCE = {
    "A100": "dgx-a100-80g",
    "H100": "dgx-h100",
    "H800": "dgx-h100",
    "H200": "dgx-h100",
}
"""The shipped profile a cluster of this GPU refines, inheriting its efficiency block (README: no fits
here)."""

EXTRA_EFFICIENCY = set(CLUSTER_KEYS)
"""Node facts a cluster file may set in its own efficiency block (benchmarks.calibrate.CLUSTER_KEYS):
published host memory, and the sustained clock of a power-capped part."""


def validation_profile(name: str) -> HardwareProfile:
    """A shipped profile by name, else validation/hardware/clusters/<name>.json."""
    path = CLUSTER_DIR / f"{name}.json"
    return load_profile(str(path)) if path.is_file() else load_profile(name)


def gpu_key(text: str) -> tuple[str | None, int | None]:
    """(GPU model, memory in GB or None) named in a device string or a row's `gpu` field."""
    model = _MODEL.search(text)
    memory = _MEMORY.search(text)
    return (model.group(1) if model else None), (int(memory.group(1)) if memory else None)


def gpu_matches(row_gpu: str, device: str) -> bool:
    """The row's GPU model equals the device's; its memory size too when the row states one."""
    row_model, row_memory = gpu_key(row_gpu)
    dev_model, dev_memory = gpu_key(device)
    if row_model is None or row_model != dev_model:
        return False
    return row_memory is None or row_memory == dev_memory


def _rows() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(PUBLISHED.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for collection in ("runs", "reference_only"):
            out += [(f"{path.name}:{row.get('id')}", row) for row in doc.get(collection, [])]
    return out


ROWS = _rows()


def test_there_are_rows_and_cluster_files():
    assert len(ROWS) >= 845 and len(CLUSTER_FILES) >= 13
    assert not CLUSTERS & SHIPPED, "a cluster file must not shadow a shipped profile name"


def _cluster_file_problems(path) -> list[str]:
    """What is wrong with one cluster file: it loads under its own name, its NICs add up, its memory
    bandwidth is below the peak, nothing is calibrated, and it refines its generation's reference
    profile, whose efficiency block it inherits (the raw file sets only its own node facts)."""
    profile = load_profile(str(path))
    raw = json.loads(path.read_text(encoding="utf-8"))
    out = []
    if profile.name != path.stem:
        out.append(f"named {profile.name!r}")
    if profile.inter_node_Gbps_per_node != pytest.approx(
        profile.nics_per_node * profile.Gbps_per_nic
    ):
        out.append(f"inter_node_Gbps_per_node {profile.inter_node_Gbps_per_node} != NICs x Gbps")
    if not profile.memory_bandwidth_GBps < profile.memory_bandwidth_peak_GBps:
        out.append("memory bandwidth not below its peak")
    if profile.calibration:
        out.append("has a calibration (nothing was measured on these clusters)")
    model, _ = gpu_key(profile.device)
    reference = GENERATION_REFERENCE[model]
    if raw.get("refines") != reference:
        out.append(f"refines {raw.get('refines')!r}, not its generation's {reference}")
    own = set(raw.get("efficiency", {}))
    if not own <= EXTRA_EFFICIENCY:
        out.append(f"sets efficiency keys {sorted(own - EXTRA_EFFICIENCY)} of {reference}'s")
    inherited = {k: v for k, v in profile.efficiency.items() if k not in own}
    if inherited != load_profile(reference).efficiency:
        out.append(f"efficiency differs from {reference}'s")
    if f"inherited from the shipped {reference} profile" not in profile.sources["efficiency"]:
        out.append(f"efficiency source does not quote {reference}'s")
    return out


def test_every_cluster_file_loads_named_after_its_file_with_its_generations_efficiency():
    """Every cluster file (one table-driven check; each failing file named with what is wrong)."""
    wrong = {path.stem: p for path in CLUSTER_FILES if (p := _cluster_file_problems(path))}
    assert CLUSTER_FILES and wrong == {}, wrong


def test_every_row_names_an_existing_profile():
    wrong = [
        f"{label}: hardware {row['hardware']!r} is no profile"
        for label, row in ROWS
        if row["hardware"] not in SHIPPED | CLUSTERS
    ]
    assert not wrong, f"{len(wrong)} rows, first: " + "; ".join(wrong[:5])


def test_every_rows_profile_device_is_the_rows_gpu():
    wrong = []
    for label, row in ROWS:
        device = validation_profile(row["hardware"]).device if "gpu" in row else None
        if device is not None and not gpu_matches(row["gpu"], device):
            wrong.append(f"{label}: gpu {row['gpu']!r} vs {row['hardware']} device {device!r}")
    assert sum("gpu" in row for _, row in ROWS) >= 845
    assert not wrong, f"{len(wrong)} rows, first: " + "; ".join(wrong[:5])


def test_every_cluster_file_is_used_by_some_row():
    used = {row["hardware"] for _, row in ROWS} | set(VTRAIN_HARDWARE.values())
    assert CLUSTERS <= used, f"unused cluster files: {sorted(CLUSTERS - used)}"


def test_renamed_rows_keep_their_old_description():
    """features.json rows moved to a profile name keep the former free text in hardware_note."""
    doc = json.loads((PUBLISHED / "features.json").read_text(encoding="utf-8"))
    notes = [r for r in doc["runs"] + doc["reference_only"] if "hardware_note" in r]
    assert len(notes) == 75
    assert all(r["hardware"] in CLUSTERS and r["hardware_note"].strip() for r in notes)
    assert all(
        r["hardware"] in SHIPPED | CLUSTERS and " " not in r["hardware"] for r in doc["runs"]
    )


@pytest.mark.parametrize(
    "row_gpu,device",
    [
        ("A100 40GB", "NVIDIA A100-SXM4-80GB"),
        ("H100 96GB (HBM2e, 500 W)", "NVIDIA H100 80GB HBM3"),
        ("H100 80GB SXM", "NVIDIA H100 96GB HBM2e"),
        ("GB200", "NVIDIA B200"),
        ("B200", "NVIDIA GB200 (Blackwell GPU)"),
        ("H800 80GB SXM", "NVIDIA H100 80GB HBM3"),
        ("H200", "NVIDIA H100 80GB HBM3"),
        ("some accelerator", "NVIDIA H100 80GB HBM3"),
    ],
)
def test_gpu_matcher_refuses_a_different_gpu(row_gpu, device):
    assert not gpu_matches(row_gpu, device)


@pytest.mark.parametrize(
    "row_gpu,device",
    [
        ("A100 80GB", "NVIDIA A100-SXM4-80GB"),
        ("A100 40GB", "NVIDIA A100-SXM4-40GB"),
        ("H100 (variant not stated)", "NVIDIA H100 96GB HBM2e"),
        ("GB200", "NVIDIA GB200 (Blackwell GPU)"),
        ("H200", "NVIDIA H200 141GB HBM3e"),
    ],
)
def test_gpu_matcher_accepts_the_same_gpu(row_gpu, device):
    assert gpu_matches(row_gpu, device)


def test_cluster_facts_from_the_publications():
    """Numbers checked by hand against the sources named in validation/hardware/clusters/README.md."""
    p = {name: validation_profile(name) for name in CLUSTERS}
    teton = p["meta-grand-teton-h100-96gb"]
    assert teton.memory_bytes == 95 * 2**30 and teton.memory_bandwidth_peak_GBps == 2400
    assert teton.peak_tflops["bf16"] == 989.4  # assumed SXM5 peak at 500 W (an upper bound, README)
    assert teton.inter_node_Gbps_per_node == 8 * 400
    h800 = p["h800-deepseek"]
    assert h800.intra_node_GBps_per_device == 200 and (h800.nics_per_node, h800.Gbps_per_nic) == (
        8,
        400,
    )
    assert (p["jean-zay-a100-80gb"].nics_per_node, p["jean-zay-a100-80gb"].Gbps_per_nic) == (4, 100)
    assert (p["azure-ndm-a100-v4"].nics_per_node, p["azure-ndm-a100-v4"].Gbps_per_nic) == (8, 200)
    assert p["azure-ndm-a100-v4"].efficiency["host_memory_bytes_per_node"] == 1900 * 2**30
    for name in ("mosaic-a100-80gb-roce1600", "mosaic-a100-40gb-roce1600", "mosaic-a100-80gb"):
        assert p[name].inter_node_Gbps_per_node == 1600
    assert p["mosaic-a100-40gb-roce1600"].memory_bytes == load_profile("p4d.24xlarge").memory_bytes
    assert p["ibm-a100-80gb-400g"].inter_node_Gbps_per_node == 400
    assert p["ibm-h100-80gb-800g"].inter_node_Gbps_per_node == 800
    assert p["meta-a100-80gb"].inter_node_Gbps_per_node == 8 * 200
    assert p["whitefiber-h200"].memory_bytes == load_profile("p5en.48xlarge").memory_bytes
    assert all(prof.devices_per_node == 8 for prof in p.values())
