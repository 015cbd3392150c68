"""Format and consistency checks of the vendored CP / FP8 / HSDP data and the kernel data.

Files: validation/published/features.json (row format in validation/published/FORMAT.md),
validation/kernels/{attention,fp8_gemm,collectives}.json, and the draft hardware profiles for H200,
B200 and GB200 (hardware_profiles/*.json, validated by hardware_profiles.load_profile).

Each validator returns a list of problems. The tests assert that the shipped files have none, and that
a deliberately broken copy is caught, so a validator that accepts everything fails here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks.published_schema import ROW, check_row
from hardware_profiles import load_profile
from planner.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
FEATURES = ROOT / "validation" / "published" / "features.json"
KERNELS = ROOT / "validation" / "kernels"
NEW_PROFILES = (
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
    "dgx-b200",
    "gb200-nvl72",
    "p6e-gb200.36xlarge",
    "dgx-b300",
    "gb300-nvl72",
)

SOURCE_KEYS = {"title", "authors_or_owner", "url", "date", "where", "hardware_note", "how_measured"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def validate_sources(sources) -> list[str]:
    """Every source has the seven FORMAT.md fields, each a non-empty string."""
    if not isinstance(sources, dict) or not sources:
        return ["no sources table"]
    errs = []
    for sid, src in sources.items():
        missing = SOURCE_KEYS - set(src)
        if missing:
            errs.append(f"source {sid}: missing {sorted(missing)}")
        elif not all(isinstance(src[k], str) and src[k].strip() for k in SOURCE_KEYS):
            errs.append(f"source {sid}: empty field")
    return errs


def validate_row(r: dict) -> list[str]:
    """Problems in one published run (FORMAT.md). Keys, types, vocabularies and ranges are the row
    schema's (benchmarks/published_schema.py: a row `check_row` refuses has that refusal as its one
    problem); its source_id and id are tests/test_published_schema.py's. Checked here is what the
    schema cannot say of one key: degree arithmetic and throughput identities.

    Degrees: gpus = dp x tp x pp x cp (world = dp x tp x pp x cp, the plan vocabulary); dp_shard divides dp
    (HSDP when smaller, then ZeRO 2 or 3); a CP run splits its sequence, so seq is a multiple of cp. When a
    row gives both the step time and the global token rate, tokens_per_s = seq x global_batch /
    iteration_time_s (the definition every source here uses) must hold within 2%.
    """
    rid = r.get("id", "?")
    try:
        check_row(r, rid)
    except ConfigError as err:
        return [str(err)]
    errs = []
    world = r["dp"] * r["tp"] * r["pp"] * r["cp"]
    if world != r["gpus"]:
        errs.append(
            f"{rid}: dp({r['dp']}) x tp({r['tp']}) x pp({r['pp']}) x cp({r['cp']}) = {world} != gpus {r['gpus']}"
        )
    if r["dp"] % r["dp_shard"]:
        errs.append(f"{rid}: dp_shard {r['dp_shard']} does not divide dp {r['dp']}")
    elif r["dp_shard"] < r["dp"] and r["zero"] < 2:
        errs.append(
            f"{rid}: HSDP (dp_shard < dp) shards parameters or gradients, so zero must be 2 or 3"
        )
    if r["global_batch"] % ((r["micro_batch"] or 1) * r["dp"]):
        errs.append(f"{rid}: global_batch {r['global_batch']} not a multiple of micro_batch x dp")
    if r["seq"] % r["cp"]:
        errs.append(f"{rid}: seq {r['seq']} not divisible by cp {r['cp']}")
    if r["virtual_stages"] > 1 and r["schedule"] != "interleaved-1f1b":
        errs.append(f"{rid}: virtual_stages > 1 needs interleaved-1f1b")
    if r["pp"] == 1 and r["schedule"] is not None:
        errs.append(f"{rid}: schedule {r['schedule']!r} without pipeline parallelism")
    if r["precision"] == "fp8" and "A100" in r["gpu"]:
        errs.append(f"{rid}: fp8 on an A100 (Ampere has no FP8 tensor cores)")
    return errs + _check_measured(rid, r)


def _check_measured(rid: str, r: dict) -> list[str]:
    measured = r["measured"]
    if not measured:
        return [f"{rid}: no measurement"]
    if "iteration_time_s" in measured and "tokens_per_s" in measured:
        implied = r["seq"] * r["global_batch"] / measured["iteration_time_s"]
        if abs(implied / measured["tokens_per_s"] - 1) > 0.02:
            return [
                f"{rid}: seq x global_batch / iteration_time_s = {implied:.0f} but tokens_per_s = "
                f"{measured['tokens_per_s']}"
            ]
    return []


def validate_runs(doc: dict) -> list[str]:
    """Problems in a published-runs document: sources, every row, excluded and reference lists."""
    errs = validate_sources(doc.get("sources"))
    sources = doc.get("sources") or {}
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        return errs + ["no runs"]
    for r in runs:
        errs += validate_row(r)
    for ex in doc.get("excluded", []):
        if set(ex) != {"what", "why"} or not all(isinstance(v, str) and v for v in ex.values()):
            errs.append(f"excluded entry must be {{what, why}}: {ex}")
    for ref in doc.get("reference_only", []):
        if ref.get("source_id") not in sources:
            errs.append(
                f"reference {ref.get('id')}: source {ref.get('source_id')!r} not in sources"
            )
        if ref.get("dp", 0) * ref.get("tp", 0) * ref.get("pp", 0) * ref.get("cp", 0) != ref.get(
            "gpus"
        ):
            errs.append(f"reference {ref.get('id')}: degrees do not multiply to gpus")
    return errs


# ------------------------------------------------------------------------------ features.json


@pytest.fixture(scope="module")
def features() -> dict:
    return _load(FEATURES)


def test_features_file_is_well_formed(features):
    assert validate_runs(features) == []


def test_each_feature_has_enough_rows_from_several_sources(features):
    """The acceptance test fits per feature with leave-one-source-out, so each needs rows from more than one source."""
    runs = features["runs"]
    groups = {
        "cp": [r for r in runs if r["cp"] > 1],
        "fp8": [r for r in runs if r["precision"] == "fp8"],
        "hsdp": [r for r in runs if r["dp_shard"] < r["dp"]],
    }
    for name, rows in groups.items():
        assert len(rows) >= 8, name
        assert len({r["source_id"] for r in rows}) >= 3, name


def test_fp8_rows_have_bf16_twins_in_the_same_source(features):
    """Comparison rows: most FP8 sources also publish the BF16 run of the same layout."""
    runs = features["runs"]
    twins = 0
    for r in (r for r in runs if r["precision"] == "fp8"):
        layout = (
            r["source_id"],
            r["model"],
            r["gpus"],
            r["tp"],
            r["pp"],
            r["cp"],
            r["seq"],
            r["global_batch"],
        )
        twins += any(
            t["precision"] != "fp8"
            and (
                t["source_id"],
                t["model"],
                t["gpus"],
                t["tp"],
                t["pp"],
                t["cp"],
                t["seq"],
                t["global_batch"],
            )
            == layout
            for t in runs
        )
    assert twins >= 30


def test_published_throughput_never_beats_the_profile_peak(features):
    """A row on a shipped profile cannot report more model TFLOP/s than that device's dense peak for its precision."""
    for r in features["runs"]:
        tflops = r["measured"].get("tflops_per_gpu")
        name = r["hardware"].split(" ")[0]
        if tflops is None or name not in {"dgx-h100", "dgx-b200", "gb200-nvl72"}:
            continue
        peak = load_profile(name).peak_tflops["fp8" if r["precision"] == "fp8" else "bf16"]
        assert tflops < peak, r["id"]


MUTATIONS = {
    "refused by the row schema": lambda r: r.update(attention="flash9"),
    "degrees do not multiply": lambda r: r.update(dp=r["dp"] * 2),
    "dp_shard does not divide dp": lambda r: r.update(dp_shard=r["dp"] + 1),
    "HSDP without sharding": lambda r: r.update(dp_shard=1, zero=1),
    "seq not divisible by cp": lambda r: r.update(seq=r["seq"] + 1),
    "fp8 on A100": lambda r: r.update(gpu="A100 80GB"),
    "token rate inconsistent": lambda r: r["measured"].update(
        tokens_per_s=r["measured"]["tokens_per_s"] * 1.5
    ),
    "no measurement": lambda r: r.update(measured={}),
}
"""One injected fault per check kept here (the schema's own refusals: tests/test_published_schema.py)."""


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_malformed_row_is_caught(features, name):
    doc = copy.deepcopy(features)
    row = next(
        r for r in doc["runs"] if r["id"] == "dgxc-2411-70b-fp8-64"
    )  # cp 2, fp8, timed: every check applies
    if name == "HSDP without sharding":
        row = next(r for r in doc["runs"] if r["dp_shard"] < r["dp"])
    MUTATIONS[name](row)
    assert validate_runs(doc), name


def test_the_schema_mutation_is_outside_the_schema_vocabulary():
    assert "flash9" not in ROW["attention"].allowed


def test_a_source_without_its_fields_is_caught(features):
    doc = copy.deepcopy(features)
    next(iter(doc["sources"].values())).pop("url")
    assert validate_runs(doc)


# ------------------------------------------------------------------------------ kernels


def _kernel_docs() -> dict[str, dict]:
    return {
        name: _load(KERNELS / f"{name}.json") for name in ("attention", "fp8_gemm", "collectives")
    }


@pytest.mark.parametrize("name", ["attention", "fp8_gemm", "collectives"])
def test_kernel_file_sources_are_complete(name):
    doc = _kernel_docs()[name]
    assert isinstance(doc.get("about"), str) and doc["about"]
    assert validate_sources(doc["sources"]) == []


def validate_attention(doc: dict) -> list[str]:
    """Every bar has its source and shape; efficiency = tflops / dense peak; the FlashAttention kernels never lose
    speed as the sequence grows (cuDNN does: 617 -> 595 TFLOP/s from 2k to 16k at head dim 128), and causal never
    beats non-causal (causal FLOPs are counted halved)."""
    errs = []
    peaks = {
        "H100 80GB SXM5": 989.4,
        "A100 80GB SXM4": 312.0,
        "H100 80GB HBM3 (TE example)": 989.4,
        "H100 PCIe (TE example)": 756.0,
    }
    series: dict[tuple, list] = {}
    for m in doc["measurements"]:
        if m["source_id"] not in doc["sources"]:
            errs.append(f"unknown source {m['source_id']}")
        # the FlashAttention figures' script: hidden 2048, 16k tokens per call
        figure = m["source_id"].startswith(("fa2-", "fa3-"))
        if m["pass"] not in ("fwd", "bwd", "fwd_bwd") or (
            figure and (m["head_dim"] * m["heads"] != 2048 or m["batch"] * m["seq"] != 16384)
        ):
            errs.append(f"bad shape {m}")
        timed = str(m["status"]).startswith("computed from the printed time")
        if not figure and (not timed or not _te_time_matches(m)):
            errs.append(f"tflops is not the FA-convention FLOPs over the printed time: {m}")
        if m["tflops"] is None:
            if m["status"] not in ("oom", "label_hidden"):
                errs.append(f"null tflops with status {m['status']}")
            continue
        if not 0 < m["tflops"] < peaks[m["gpu"]]:
            errs.append(f"{m['kernel']} {m['tflops']} outside (0, peak)")
        if abs(m["fraction_of_dense_peak"] - m["tflops"] / peaks[m["gpu"]]) > 0.001:
            errs.append(f"fraction_of_dense_peak wrong for {m}")
        key = (m["source_id"], m["gpu"], m["pass"], m["kernel"], m["head_dim"])
        series.setdefault(key + (m["causal"],), []).append((m["seq"], m["tflops"]))
    for key, pts in series.items():
        pts.sort()
        fused = key[3] in ("flash_attention_2", "flash_attention_3")
        if fused and any(b[1] < a[1] for a, b in zip(pts, pts[1:])):
            errs.append(f"{key}: throughput falls with sequence length")
        if key[-1]:
            other = dict(series.get(key[:-1] + (False,), []))
            errs += [
                f"{key} seq {s}: causal {t} above non-causal {other[s]}"
                for s, t in pts
                if s in other and t > other[s]
            ]
    return errs


def _te_time_matches(m) -> bool:
    """A timed entry (Transformer Engine's example): tflops = 3.5 x 4 b s^2 h d (x 1/2 causal) over
    the forward + backward time its status prints."""
    ms = float(m["status"].removeprefix("computed from the printed time, ").removesuffix(" ms"))
    flops = 3.5 * 4 * m["batch"] * m["seq"] ** 2 * m["heads"] * m["head_dim"]
    flops *= 0.5 if m["causal"] else 1.0
    return abs(flops / (ms * 1e-3) / 1e12 - m["tflops"]) <= 0.05


def test_attention_data_is_consistent():
    assert validate_attention(_kernel_docs()["attention"]) == []


def test_attention_validator_catches_a_misread_bar():
    doc = copy.deepcopy(_kernel_docs()["attention"])
    bar = next(
        m
        for m in doc["measurements"]
        if m["kernel"] == "flash_attention_2" and m["seq"] == 8192 and m["tflops"]
    )
    bar["tflops"] = bar["tflops"] * 3
    assert validate_attention(doc)


def test_fa3_is_at_least_twice_as_efficient_as_fa2_forward_was_on_h100_at_long_sequences():
    """The FA3 paper's claim (1.5-2.0x over FA2, 75% peak) against the vendored bars at 16k, head dim 128."""
    m = _kernel_docs()["attention"]["measurements"]
    bar = {
        (x["kernel"], x["causal"]): x["tflops"]
        for x in m
        if x["source_id"] == "fa3-readme-h100" and x["seq"] == 16384 and x["head_dim"] == 128
    }
    for causal in (False, True):
        assert 1.5 <= bar[("flash_attention_3", causal)] / bar[("flash_attention_2", causal)] <= 2.0


def validate_fp8(doc: dict) -> list[str]:
    """FP8 peaks are twice BF16 (and FP4 twice FP8); every end-to-end speedup equals its own numbers and stays
    below the 2x peak ratio (only the GEMMs run in FP8)."""
    errs = []
    for p in doc["peak_ratios"]:
        if p["fp8_dense_tflops"] != pytest.approx(2 * p["bf16_dense_tflops"], rel=1e-3):
            errs.append(f"{p['gpu']}: fp8 peak is not 2x bf16")
        if "fp4_dense_tflops" in p and p["fp4_dense_tflops"] != pytest.approx(
            2 * p["fp8_dense_tflops"], rel=1e-3
        ):
            errs.append(f"{p['gpu']}: fp4 peak is not 2x fp8")
    for s in doc["end_to_end_speedups"]:
        if s["source_id"] not in doc["sources"]:
            errs.append(f"{s['what']}: unknown source")
        bf16, fp8, speed = (
            s[k] if isinstance(s[k], list) else [s[k]] for k in ("bf16", "fp8", "speedup")
        )
        for b, f, x in zip(bf16, fp8, speed):
            ratio = b / f if s["unit"] in ("s/step", "ms/step", "days") else f / b
            if abs(ratio - x) > 0.002 or not 0.9 < x < 2.0:
                errs.append(f"{s['what']}: speedup {x} vs its numbers {ratio:.3f}")
    return errs


def test_fp8_data_is_consistent():
    assert validate_fp8(_kernel_docs()["fp8_gemm"]) == []


def test_fp8_validator_catches_a_speedup_above_the_peak_ratio():
    doc = copy.deepcopy(_kernel_docs()["fp8_gemm"])
    doc["end_to_end_speedups"][0]["fp8"] = doc["end_to_end_speedups"][0]["bf16"] / 2.5
    assert validate_fp8(doc)


def test_fp8_end_to_end_speedups_match_the_published_twin_rows(features):
    """The speedups quoted in fp8_gemm.json that name their rows are those rows' own step times."""
    by_id = {r["id"]: r for r in features["runs"]}
    for s in _kernel_docs()["fp8_gemm"]["end_to_end_speedups"]:
        if "rows" in s:
            bf16, fp8 = (by_id[i]["measured"]["iteration_time_s"] for i in s["rows"])
            assert (bf16, fp8) == (s["bf16"], s["fp8"])


def test_nccl_bus_bandwidth_follows_the_nccl_tests_definition():
    """all-reduce busbw = algbw x 2(n-1)/n (nccl-tests doc/PERFORMANCE.md), and algbw = bytes / time."""
    for series in _kernel_docs()["collectives"]["series"]:
        n = series["gpus"]
        for p in series["points"]:
            if p["algbw_GBps"] >= 1:
                assert p["busbw_GBps"] == pytest.approx(p["algbw_GBps"] * 2 * (n - 1) / n, abs=0.02)
                assert p["algbw_GBps"] == pytest.approx(
                    p["bytes"] / (p["time_us"] * 1e-6) / 1e9, rel=0.01
                )


# ------------------------------------------------------------------------------ new hardware profiles


@pytest.mark.parametrize("name", NEW_PROFILES)
def test_new_profile_loads_and_follows_the_datasheet_ratios(name):
    p = load_profile(name)
    assert p.name == name
    assert p.peak_tflops["fp8"] == pytest.approx(2 * p.peak_tflops["bf16"], rel=1e-3)
    assert p.peak_tflops["fp16"] == p.peak_tflops["bf16"]
    assert p.memory_bandwidth_GBps == pytest.approx(
        p.memory_bandwidth_peak_GBps * 3017.3 / 3350, rel=1e-3
    )
    assert (
        "nvlink" in p.description.lower() and "domain" in p.description.lower()
    )  # proposed nvlink_domain_devices
    assert (
        "carried over" in p.sources["efficiency"] and not p.calibration
    )  # nothing measured, and it says so


def test_new_profile_facts():
    """Numbers checked by hand against the sources in validation/hardware/new_profiles.md."""
    h200, b200, gb200 = (
        load_profile("p5en.48xlarge"),
        load_profile("p6-b200.48xlarge"),
        load_profile("gb200-nvl72"),
    )
    assert (
        h200.memory_bytes == load_profile("p5e.48xlarge").memory_bytes < 141 * 2**30
    )  # AWS: 141 GiB
    assert 139.7 < h200.memory_bytes / 2**30 < 139.9 and 178.3 < b200.memory_bytes / 2**30 < 178.4
    assert 184.2 < gb200.memory_bytes / 2**30 < 184.4
    assert (h200.nics_per_node, h200.Gbps_per_nic) == (16, 200)  # EFAv3
    assert (load_profile("p5e.48xlarge").nics_per_node, b200.nics_per_node) == (32, 8)
    assert h200.intra_node_GBps_per_device == 450 and b200.intra_node_GBps_per_device == 900
    assert b200.peak_tflops["bf16"] == 2250 and gb200.peak_tflops["bf16"] == 2500
    assert gb200.devices_per_node == 72 and load_profile("p6e-gb200.36xlarge").devices_per_node == 4
    assert load_profile("dgx-b200").price_usd_per_hour is None


def test_blackwell_ultra_profile_facts():
    """validation/hardware/new_profiles.md, Blackwell Ultra: the usable memory torch reports,
    B200's and GB200's training rates, 800 Gb/s ConnectX-8 per GPU, the Blackwell efficiency."""
    b300, gb300 = load_profile("dgx-b300"), load_profile("gb300-nvl72")
    b200, gb200 = load_profile("dgx-b200"), load_profile("gb200-nvl72")
    assert round(b300.memory_bytes / 2**30, 2) == 267.69
    assert round(gb300.memory_bytes / 2**30, 2) == 276.50
    training = ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8")
    for ultra, base in ((b300, b200), (gb300, gb200)):
        assert {k: ultra.peak_tflops[k] for k in training} == {
            k: base.peak_tflops[k] for k in training
        }
    # dense FP4: HGX B300 105 PF / 8 against HGX B200 72 PF / 8; GB300 15 PF against GB200 10 PF
    assert (b300.peak_tflops["nvfp4"], b200.peak_tflops["nvfp4"]) == (13125, 9000)
    assert (gb300.peak_tflops["nvfp4"], gb200.peak_tflops["nvfp4"]) == (15000, 10000)
    assert (b300.nics_per_node, b300.Gbps_per_nic) == (8, 800)
    assert (gb300.nics_per_node, gb300.Gbps_per_nic, gb300.devices_per_node) == (72, 800, 72)
    assert b300.efficiency == b200.efficiency and gb300.efficiency == gb200.efficiency


def test_a_plan_that_misses_a_gb200_fits_a_gb300_and_runs_no_slower():
    """Llama 3 70B at tp 2 needs about 230 GiB a GPU: more than a GB200's 184, less than 276."""
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    cfg = ParallelConfig(
        dp=36, tp=2, pp=1, micro_batch=1, global_batch=72, seq=8192, zero=1,
        sequence_parallel=True, precision="fp8", framework="megatron",
    )  # fmt: skip
    on200, on300 = (
        estimate("llama3-70b", hw, cfg, gpus=72) for hw in ("gb200-nvl72", "gb300-nvl72")
    )
    assert not on200.fits and on300.fits
    assert on300.step_time_s <= on200.step_time_s
