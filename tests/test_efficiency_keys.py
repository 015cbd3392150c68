"""The efficiency block is one typed table (hardware_profiles.efficiency): every key has a unit, a
default, a range and a source; unknown keys and impossible values are refused at load; every key is
read by the cost models and every key calibrate writes is in the table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hardware_profiles import available_profiles, load_profile
from hardware_profiles.efficiency import EFFICIENCY_KEYS, efficiency
from planner.calibrate import efficiency_from_fits
from planner.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _profile_dict(name="p5.48xlarge") -> dict:
    return json.loads((ROOT / "hardware_profiles" / f"{name}.json").read_text())


def test_every_key_is_documented_with_unit_range_and_source():
    for key in EFFICIENCY_KEYS.values():
        assert key.unit and key.doc and key.source
        assert key.low < key.high
        assert key.default is not None or key.fallback in EFFICIENCY_KEYS


def test_every_key_is_read_by_the_cost_models():
    code = "".join(
        p.read_text() for d in ("cost_models", "planner") for p in (ROOT / d).rglob("*.py")
    )
    for name in EFFICIENCY_KEYS:
        assert re.search(rf"[\"']{name}[\"']", code), f"efficiency key {name} is never read"


def test_every_key_calibrate_writes_is_in_the_table():
    class Fit:
        busbw_GBps, rate_tflops, overhead_us, bandwidth_share_at_max = 10.0, 1.0, 5.0, 1.0

    fits = {
        "collectives": {c: Fit() for c in ("p2p", "allreduce", "allgather", "reducescatter")},
        "gemm": {"fp32": Fit(), "bf16": Fit()},
    }
    written = set(efficiency_from_fits(fits, {"fp32": 2.0, "bf16": 4.0})) | {"shared_cores_speedup"}
    assert written <= set(EFFICIENCY_KEYS)
    local = json.loads((ROOT / "hardware_profiles" / "cpu-local.json").read_text())["efficiency"]
    assert set(local) <= set(EFFICIENCY_KEYS)


@pytest.mark.parametrize("name", available_profiles())
def test_shipped_profiles_use_only_known_keys(name):
    assert set(load_profile(name).efficiency) <= set(EFFICIENCY_KEYS)


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("gemm_efficiency_max", 0.0, "efficiency.gemm_efficiency_max=0.0 is invalid"),
        ("gemm_efficiency_max", 1.5, "<= 1"),
        ("flash_attention_efficiency", -0.1, "flash_attention_efficiency"),
        ("allreduce_bus_efficiency", float("nan"), "allreduce_bus_efficiency"),
        ("allgather_bus_efficiency", 0.0, "allgather_bus_efficiency=0.0 is invalid"),
        ("gemm_fixed_us", -1, "gemm_fixed_us"),
        ("shared_cores_speedup", 0.5, ">= 1"),
        ("gemm_effciency_max", 0.7, "unknown key 'efficiency.gemm_effciency_max'"),
    ],
)
def test_impossible_or_unknown_values_are_refused_naming_the_key(tmp_path, key, value, needle):
    data = _profile_dict()
    data["efficiency"][key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert needle in str(err.value) and str(path) in str(err.value)


def test_fallbacks_and_defaults():
    hw = load_profile("p5.48xlarge")
    assert (
        efficiency(hw, "allgather_bus_efficiency")
        == efficiency(hw, "allreduce_bus_efficiency")
        == 0.8
    )
    assert efficiency(hw, "alltoall_bus_efficiency") == 0.8
    local = load_profile("cpu-local")
    assert (
        efficiency(local, "allgather_bus_efficiency")
        == local.efficiency["allgather_bus_efficiency"]
    )
    assert efficiency(local, "allgather_bus_efficiency") != efficiency(
        local, "allreduce_bus_efficiency"
    )
    assert efficiency(hw, "pcie_efficiency") == EFFICIENCY_KEYS["pcie_efficiency"].default
