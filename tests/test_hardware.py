"""Hardware profiles: every shipped file loads with sane, sourced numbers; every bad file is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hardware_profiles import HardwareProfile, available_profiles, load_profile
from hardware_profiles.loader import KEYS, PROFILE_DIR, profile_from_dict, profile_to_dict
from planner.cli import app
from planner.errors import ConfigError

runner = CliRunner()
CONTRACT = (
    "p3.16xlarge",
    "p3dn.24xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "dgx-a100-80g",
    "dgx-h100",
    "cpu-local",
)
VALIDATION = Path(__file__).resolve().parents[1] / "validation" / "h100_train_steps.jsonl"


def test_every_contract_profile_is_shipped():
    assert set(CONTRACT) <= set(available_profiles())


@pytest.mark.parametrize("name", available_profiles())
def test_profile_loads_with_its_own_name_and_a_source_for_every_number(name):
    p = load_profile(name)
    assert isinstance(p, HardwareProfile) and p.name == name
    numeric = [
        k
        for k, s in KEYS.items()
        if s.kind in ("int", "number", "tflops") and getattr(p, k) is not None
    ]
    assert set(numeric) <= set(p.sources)
    assert p.inter_node_Gbps_per_node == pytest.approx(p.nics_per_node * p.Gbps_per_nic)
    assert profile_from_dict(profile_to_dict(p)) == p  # the --json form round-trips


def test_datasheet_facts():
    """A few numbers checked by hand against the vendors' pages (see each file's sources)."""
    p4d, p5, dgx = (
        load_profile("p4d.24xlarge"),
        load_profile("p5.48xlarge"),
        load_profile("dgx-a100-80g"),
    )
    assert p4d.inter_node_Gbps_per_node == 4 * 100 and p4d.intra_node_GBps_per_device == 600 / 2
    assert p5.inter_node_Gbps_per_node == 3200 and p5.intra_node_GBps_per_device == 900 / 2
    assert dgx.inter_node_Gbps_per_node == 8 * 200
    assert load_profile("dgx-h100").inter_node_Gbps_per_node == 8 * 400
    assert p4d.peak_tflops["bf16"] == 312 and p5.peak_tflops["bf16"] == pytest.approx(989.4)
    assert "bf16" not in load_profile("p3.16xlarge").peak_tflops  # Volta has no bf16 tensor cores
    # usable capacity as CUDA reports it, not the marketing number
    assert load_profile("p3.16xlarge").memory_bytes == 16945512448
    assert load_profile("p3dn.24xlarge").memory_bytes == 34089730048
    assert p4d.memory_bytes == 42505273344
    assert load_profile("p4de.24xlarge").memory_bytes == dgx.memory_bytes < 80 * 2**30


def test_h100_numbers_match_the_validation_measurements():
    rows = [json.loads(line) for line in VALIDATION.read_text().splitlines() if line.strip()]
    meta = next(r for r in rows if r["kind"] == "meta")
    copy = next(r for r in rows if r["kind"] == "copy")
    best_gemm = max(r["tflops"] for r in rows if r["kind"] == "gemm_bf16")
    for name in ("p5.48xlarge", "dgx-h100"):
        p = load_profile(name)
        assert p.memory_bytes == meta["total_mem"]
        assert p.memory_bandwidth_GBps == pytest.approx(copy["GBps"], rel=1e-3)
        assert best_gemm < p.peak_tflops["bf16"]  # a measured rate never beats the datasheet peak
        fit = p.calibration["gemm"]["bf16"]
        assert fit["best_measured_tflops"] == pytest.approx(best_gemm, rel=1e-6)


def test_load_by_path(tmp_path):
    path = tmp_path / "mine.json"
    doc = json.loads((PROFILE_DIR / "p4d.24xlarge.json").read_text())
    doc["name"] = "mine"
    path.write_text(json.dumps(doc))
    assert load_profile(str(path)).name == "mine"


def _refining(tmp_path: Path, own: dict) -> Path:
    """A user's cluster file: p5.48xlarge's node facts with a slower network, refining dgx-h100 and
    setting `own` efficiency keys."""
    doc = json.loads((PROFILE_DIR / "p5.48xlarge.json").read_text())
    doc.update(name="my-h100", refines="dgx-h100", efficiency=own, inter_node_latency_us=20.0)
    doc["sources"].pop("efficiency")
    if own:
        doc["sources"]["efficiency"] = "measured with nccl-tests on my cluster"
    doc["sources"]["inter_node_latency_us"] = "measured on my cluster"
    path = tmp_path / "my-h100.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_refining_profile_inherits_the_efficiency_keys_it_does_not_set(tmp_path):
    """The inherited block is dgx-h100's as its file states it; a key the file sets is its own; its
    node facts are its own; and the provenance quotes the profile it came from."""
    shipped = json.loads((PROFILE_DIR / "dgx-h100.json").read_text())
    mine = load_profile(str(_refining(tmp_path, {"allreduce_bus_efficiency": 0.7})))
    assert mine.efficiency == {**shipped["efficiency"], "allreduce_bus_efficiency": 0.7}
    assert mine.inter_node_latency_us == 20.0 and mine.name == "my-h100"
    assert "inherited from the shipped dgx-h100 profile" in mine.sources["efficiency"]
    assert "allreduce_bus_efficiency" not in mine.sources["efficiency"].split(":")[0]


def test_estimate_takes_a_refining_profile_file(tmp_path):
    """End to end: the same plan on the refined file differs from p5.48xlarge only by what the file
    changed (here a slower all-reduce bus, which a dp=64 step with ZeRO-1 pays)."""
    args = ["estimate", "llama3-8b", "--gpus", "64", "--dp", "64", "--zero", "1", "--json"]
    p5 = runner.invoke(app, [*args, "--hardware", "p5.48xlarge"])
    same = runner.invoke(app, [*args, "--hardware", str(_refining(tmp_path, {}))])
    assert p5.exit_code == same.exit_code == 0, p5.output + same.output
    slow = _refining(tmp_path, {"allreduce_bus_efficiency": 0.2})
    slower = runner.invoke(app, [*args, "--hardware", str(slow)])
    t = [json.loads(r.output)["prediction"]["step_time_s"] for r in (p5, same, slower)]
    assert t[0] <= t[1] < t[2], t


# ------------------------------------------------------------------------------ error paths


def _write(tmp_path: Path, mutate) -> Path:
    doc = json.loads((PROFILE_DIR / "p4d.24xlarge.json").read_text())
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


BAD = {
    "missing key": (lambda d: d.pop("memory_bytes"), "missing required key 'memory_bytes'"),
    "wrong type": (lambda d: d.update(devices_per_node="8"), "devices_per_node='8' is invalid"),
    "float for int": (
        lambda d: d.update(memory_bytes=4.2e10),
        "memory_bytes=42000000000.0 is invalid",
    ),
    "bool for int": (lambda d: d.update(devices_per_node=True), "devices_per_node=True is invalid"),
    "negative bandwidth": (
        lambda d: d.update(intra_node_GBps_per_device=-300.0),
        "intra_node_GBps_per_device=-300.0 is invalid",
    ),
    "zero latency": (
        lambda d: d.update(inter_node_latency_us=0),
        "inter_node_latency_us=0 is invalid",
    ),
    "unknown key": (lambda d: d.update(nvlink_speed=1), "unknown key 'nvlink_speed'"),
    "unknown dtype": (
        lambda d: d["peak_tflops"].update(int4=1.0),
        "unknown key 'peak_tflops.int4'",
    ),
    "NaN peak": (
        lambda d: d["peak_tflops"].update(bf16=float("nan")),
        "peak_tflops.bf16=nan is invalid",
    ),
    "no fp32 peak": (
        lambda d: d["peak_tflops"].pop("fp32"),
        "missing required key 'peak_tflops.fp32'",
    ),
    "nics disagree": (
        lambda d: d.update(nics_per_node=2),
        "nics_per_node(2) x Gbps_per_nic(100) = 200",
    ),
    "unsourced number": (
        lambda d: d["sources"].pop("memory_bytes"),
        "missing required key 'sources.memory_bytes'",
    ),
    "efficiency not numbers": (
        lambda d: d["efficiency"].update(gemm_fixed_us="high"),
        "efficiency.gemm_fixed_us='high' is invalid",
    ),
    "not an object": (lambda d: d.clear() or d.update(name=["x"]), "name=['x'] is invalid"),
    "refines no shipped profile": (
        lambda d: d.update(refines="dgx-h900"),
        "refines='dgx-h900' is invalid: allowed the name of a shipped profile: ",
    ),
    "refines a path": (
        lambda d: d.update(refines="hardware_profiles/dgx-h100.json"),
        "refines='hardware_profiles/dgx-h100.json' is invalid",
    ),
    "refining key without a source": (
        lambda d: (
            d.update(refines="dgx-h100", efficiency={"gemm_fixed_us": 9.0})
            or d["sources"].pop("efficiency")
        ),
        "missing required key 'sources.efficiency' (where its own efficiency keys gemm_fixed_us",
    ),
    "refining efficiency not numbers": (
        lambda d: d.update(refines="dgx-h100", efficiency={"gemm_fixed_us": "high"}),
        "efficiency.gemm_fixed_us='high' is invalid",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_profile_is_one_line_exit_2_naming_key_and_file(tmp_path, case):
    mutate, expected = BAD[case]
    path = _write(tmp_path, mutate)
    result = runner.invoke(app, ["hardware", "show", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert expected in lines[0] and str(path) in lines[0]


def test_malformed_json_is_one_line_exit_2(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x",, }')
    result = runner.invoke(app, ["hardware", "show", str(path)])
    assert result.exit_code == 2
    assert (
        result.output.count("\n") == 1
        and "not valid JSON" in result.output
        and str(path) in result.output
    )


def test_top_level_not_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a JSON object"):
        load_profile(str(path))


def test_unknown_name_lists_the_available_profiles():
    result = runner.invoke(app, ["hardware", "show", "tpu-v9"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "hardware='tpu-v9'" in result.output
    for name in CONTRACT:
        assert name in result.output


def test_missing_path_is_exit_2():
    result = runner.invoke(app, ["hardware", "show", "/nonexistent/profile.json"])
    assert result.exit_code == 2 and "no such profile file" in result.output


# ------------------------------------------------------------------------------ list and show


def test_list_shows_every_profile():
    result = runner.invoke(app, ["hardware", "list"])
    assert result.exit_code == 0
    for name in CONTRACT:
        assert name in result.output


def test_list_json():
    result = runner.invoke(app, ["hardware", "list", "--json"])
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.stdout)["profiles"]}
    assert rows["p4d.24xlarge"]["bf16_tflops"] == 312 and rows["p3.16xlarge"]["bf16_tflops"] is None


def test_show_json_loads_back(tmp_path):
    result = runner.invoke(app, ["hardware", "show", "p5.48xlarge", "--json"])
    assert result.exit_code == 0
    path = tmp_path / "copy.json"
    path.write_text(result.stdout)
    assert load_profile(str(path)) == load_profile("p5.48xlarge")


def test_show_human_prints_sources():
    result = runner.invoke(app, ["hardware", "show", "dgx-a100-80g"])
    assert result.exit_code == 0
    assert "source:" in result.output and "HDR" in result.output
