"""Goodput in recommend (planner.goodput through planner.search and the CLI): the acceptance command,
the documents it writes, the user's own reliability numbers moving the figures the right way, the
storage profiles as validated data, and every bad input as one line and exit 2."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError
from planner.goodput import ReliabilityInputs, checkpoint_state
from planner.search import recommend

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
ACCEPT = [
    "recommend",
    "gpt3-175b",
    "--hardware",
    "p4d.24xlarge",
    "--gpus",
    "960",
    "--tokens",
    "300B",
    "--objective",
    "time-to-train",
]
GPT2 = ["recommend", "gpt2", "--hardware", "p4d.24xlarge", "--gpus", "16"]


@pytest.fixture(scope="module")
def accept_json() -> dict:
    result = runner.invoke(app, [*ACCEPT, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def small(**kw):
    kw.setdefault("tokens", 10e9)
    return recommend("gpt2", "p4d.24xlarge", gpus=16, top=2, **kw)


# ------------------------------------------------------------------------------------ acceptance


def test_acceptance_command_prints_goodput_interval_and_both_times():
    result = runner.invoke(app, ACCEPT)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "objective time-to-train" in out
    goodput = re.search(r"^goodput (\d+\.\d)%: (\d+\.\d) expected interruptions", out, re.M)
    assert goodput and 80 < float(goodput.group(1)) < 100 and float(goodput.group(2)) > 1
    assert "checkpoint every" in out and " min (blocking to fsx-lustre" in out
    assert "days without failures" in out and "days with them" in out


def test_acceptance_json_carries_goodput_and_interval(accept_json):
    best = accept_json["best"]
    pred, rel = best["prediction"], best["prediction"]["reliability"]
    assert accept_json["objective"] == "time-to-train"
    assert 0.8 < best["goodput"] < 1 and best["goodput"] == pred["goodput"] == rel["goodput"]
    assert (
        best["checkpoint_interval_s"]
        == best["plan"]["checkpoint_interval_s"]
        == rel["checkpoint_interval_s"]
        > 0
    )
    assert rel["time_to_train_s"] > rel["time_to_train_without_failures_s"]
    assert rel["time_to_train_without_failures_s"] == pytest.approx(
        math.ceil(300e9 / (best["plan"]["global_batch"] * 2048)) * pred["step_time_s"]
    )
    assert rel["goodput"] == pytest.approx(
        rel["time_to_train_without_failures_s"] / rel["time_to_train_s"]
    )
    assert rel["usd"] > rel["usd_without_failures"] > 0
    assert pred["to_train"]["seconds"] == rel["time_to_train_s"]
    assert pred["to_train"]["seconds_without_failures"] == rel["time_to_train_without_failures_s"]
    # the checkpoint is GPT-3's 175B parameters with 14 bytes each (bf16 weights, fp32 master and Adam moments)
    assert rel["checkpoint_bytes"] == pytest.approx(best["model"]["params"] * 14)


def test_time_to_train_ranks_by_the_expected_wall_time(accept_json):
    """In the expected wall time's order, after the near-tie ranked first (test_uncertainty.py)."""
    times = [
        d["prediction"]["reliability"]["time_to_train_s"]
        for d in (accept_json["best"], *accept_json["alternatives"])
    ]
    ties = accept_json["best"]["search"].get("near_ties") or {"fastest": 0, "plans": [0]}
    assert times[ties["fastest"]] == min(times) and 0 in ties["plans"]
    assert times[1:] == sorted(times[1:])


def test_recommend_json_with_goodput_matches_the_schemas(accept_json, tmp_path):
    import jsonschema
    from referencing import Registry, Resource

    from planner.plan import load_plan, plan_schema

    schema = json.loads((ROOT / "planner" / "schemas" / "recommend.schema.json").read_text())
    registry = Registry().with_resource(
        "https://github.com/planner/planner/schemas/plan.schema.json",
        Resource.from_contents(plan_schema()),
    )
    jsonschema.Draft202012Validator(schema, registry=registry).validate(accept_json)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(accept_json["best"]))
    assert (
        load_plan(path).document["plan"]["checkpoint_interval_s"]
        == accept_json["best"]["checkpoint_interval_s"]
    )


def test_the_exported_checkpoint_interval_is_the_plans(accept_json, tmp_path):
    """planner export turns plan.checkpoint_interval_s into steps (planner/exports/common.py)."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(accept_json["best"]))
    result = runner.invoke(app, ["export", str(path), "--format", "megatron"])
    assert result.exit_code == 0, result.output
    best = accept_json["best"]
    steps = max(1, round(best["checkpoint_interval_s"] / best["prediction"]["step_time_s"]))
    assert f"--save-interval {steps}" in result.stdout


def test_without_tokens_nothing_about_goodput_is_added():
    rec = recommend("gpt2", "p4d.24xlarge", gpus=16, top=2)
    assert "goodput" not in rec.best and "reliability" not in rec.best["prediction"]
    assert "checkpoint_interval_s" not in rec.best["plan"]


# ------------------------------------------------------------- the user's numbers move the figures


def test_a_faster_restart_raises_goodput():
    slow, fast = small(), small(reliability=ReliabilityInputs(restart_s=0))
    assert fast.best["goodput"] > slow.best["goodput"]
    assert fast.best["prediction"]["reliability"]["restart_s"] == pytest.approx(
        fast.best["prediction"]["reliability"]["checkpoint_read_s"]
    )


def test_rarer_failures_raise_goodput_and_lengthen_the_interval():
    base, rare = small(), small(reliability=ReliabilityInputs(mtbf_gpu_hours=1e7))
    b, r = base.best["prediction"]["reliability"], rare.best["prediction"]["reliability"]
    assert r["mtbf_hours"] == pytest.approx(1e7 / 16)  # all failures per GPU: 16 GPUs
    assert r["goodput"] > b["goodput"] and r["checkpoint_interval_s"] > b["checkpoint_interval_s"]
    assert r["expected_interruptions"] < b["expected_interruptions"]


def test_faster_storage_writes_faster_and_async_stalls_less():
    slow = small(tokens=300e9).best["prediction"]["reliability"]
    fast = small(tokens=300e9, reliability=ReliabilityInputs(storage="fsx-lustre-1000"))
    fast = fast.best["prediction"]["reliability"]
    assert (
        fast["checkpoint_write_s"] < slow["checkpoint_write_s"]
        and fast["storage"] == "fsx-lustre-1000"
    )
    asynchronous = small(tokens=300e9, reliability=ReliabilityInputs(checkpoint="async"))
    asynchronous = asynchronous.best["prediction"]["reliability"]
    assert asynchronous["checkpoint_stall_s"] < slow["checkpoint_stall_s"]
    assert asynchronous["restart_s"] == pytest.approx(
        slow["restart_s"] + asynchronous["checkpoint_write_s"]
    )


def test_spot_reclaims_add_to_the_failure_rate():
    on, spot = (
        small(),
        small(
            spot=True,
            price_per_hour=10.0,
            reliability=ReliabilityInputs(spot_interruptions_per_node_hour=0.05),
        ),
    )
    assert (
        spot.best["prediction"]["reliability"]["mtbf_hours"]
        < on.best["prediction"]["reliability"]["mtbf_hours"]
    )
    assert spot.best["goodput"] < on.best["goodput"]
    rel = spot.best["prediction"]["reliability"]
    assert rel["usd"] > rel["usd_without_failures"]


def test_spot_without_a_rate_is_noted_outside_time_to_train():
    result = runner.invoke(app, [*GPT2, "--tokens", "1B", "--spot", "--price-per-hour", "10"])
    assert result.exit_code == 0, result.output
    assert "leaves out spot reclaims" in result.stderr


def test_the_checkpoint_is_sharded_as_the_plan_shards_it():
    """ZeRO 1 shards the optimizer state over dp, ZeRO 3 the parameters too; tp x pp split both."""
    doc = {
        "model": {"params": 1.2e9},
        "plan": {
            "dp": 4,
            "tp": 2,
            "pp": 3,
            "zero": 1,
            "precision": "amp-bf16",
            "optimizer": "adamw",
            "framework": "megatron",
        },
    }
    z1 = checkpoint_state(doc)
    assert z1.unique_bytes == pytest.approx(1.2e9 * 14)  # 2 + 4 + 4 + 4 bytes per parameter
    assert z1.bytes_per_gpu == pytest.approx(1.2e9 / 6 * (2 + 12 / 4))
    doc["plan"]["zero"] = 3
    assert checkpoint_state(doc).bytes_per_gpu == pytest.approx(1.2e9 / 6 * 14 / 4)
    doc["plan"]["zero"], doc["plan"]["offload"] = 1, "optimizer"
    assert checkpoint_state(doc).staged_bytes_per_gpu == pytest.approx(1.2e9 / 6 * 2)


# ------------------------------------------------------------------------------ storage profiles


def test_shipped_storage_profiles_load_and_fsx_follows_its_formula():
    from storage_profiles import available_storage, load_reliability_defaults, load_storage

    assert {"fsx-lustre", "fsx-lustre-1000", "s3"} <= set(available_storage())
    for name in available_storage():
        profile = load_storage(name)
        assert profile.name == name
    facts = {
        f["id"]: f
        for f in json.loads((ROOT / "validation" / "reliability" / "reliability.json").read_text())[
            "facts"
        ]
    }
    tiers = facts["fsx-persistent2-ssd-throughput"]["value"]
    tib = 100800 / 1024
    for name, tier in (("fsx-lustre", min(tiers)), ("fsx-lustre-1000", max(tiers))):
        assert load_storage(name).write_GBps_aggregate == pytest.approx(tib * tier / 1000, abs=0.05)
    assert load_reliability_defaults().storage in available_storage()


def _profile(**changes) -> dict:
    data = json.loads((ROOT / "storage_profiles" / "s3.json").read_text())
    data.update(changes)
    return data


@pytest.mark.parametrize(
    "data,needle",
    [
        (_profile(colour="blue"), "colour"),
        (_profile(write_GBps_per_node=-1), "write_GBps_per_node=-1"),
        (_profile(write_GBps_per_node="fast"), "write_GBps_per_node='fast'"),
        (_profile(read_GBps_aggregate=1e9), "read_GBps_aggregate"),
        (_profile(sources={}), "sources.write_GBps_aggregate"),
        (_profile(schema_version="2"), "schema_version"),
        ({k: v for k, v in _profile().items() if k != "read_GBps_per_node"}, "read_GBps_per_node"),
    ],
)
def test_a_bad_storage_profile_is_one_error_naming_the_key(tmp_path, data, needle):
    from storage_profiles.loader import storage_from_dict

    with pytest.raises(ConfigError, match=needle):
        storage_from_dict(data, origin="x.json")
    path = tmp_path / "storage.json"
    path.write_text(json.dumps(data))
    result = runner.invoke(app, [*GPT2, "--tokens", "1B", "--storage", str(path)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and needle in lines[0], result.output


def test_a_storage_profile_file_of_ones_own_is_used(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps(_profile(name="mine", write_GBps_per_node=0.1, read_GBps_per_node=0.1))
    )
    rec = small(reliability=ReliabilityInputs(storage=str(path)))
    rel = rec.best["prediction"]["reliability"]
    per_node = rel["checkpoint_bytes"] / rec.best["hardware"]["nodes"]
    assert rel["storage"] == "mine" and rel["checkpoint_write_s"] == pytest.approx(per_node / 0.1e9)


# ------------------------------------------------------------------------------ one line, exit 2


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--objective", "time-to-train"], "--tokens"),
        (["--objective", "fastest", "--tokens", "1B"], "objective"),
        (["--tokens", "1B", "--mtbf-gpu-hours", "0"], "mtbf-gpu-hours=0.0"),
        (["--tokens", "1B", "--mtbf-gpu-hours", "nan"], "mtbf-gpu-hours=nan"),
        (["--tokens", "1B", "--mtbf-gpu-hours", "inf"], "mtbf-gpu-hours=inf"),
        (["--tokens", "1B", "--mtbf-node-hours", "-5"], "mtbf-node-hours=-5.0"),
        (["--tokens", "1B", "--mtbf-node-hours", "1e12"], "mtbf-node-hours"),
        (["--tokens", "1B", "--restart-s", "-1"], "restart-s=-1.0"),
        (["--tokens", "1B", "--restart-s", "1e9"], "restart-s"),
        (["--tokens", "1B", "--storage", "nowhere"], "storage='nowhere'"),
        (["--tokens", "1B", "--storage", "/nonexistent/storage.json"], "not a readable file"),
        (["--tokens", "1B", "--checkpoint", "sometimes"], "checkpoint='sometimes'"),
        (["--restart-s", "60"], "--restart-s needs --tokens"),
        (["--storage", "s3"], "--storage needs --tokens"),
        (["--tokens", "1B", "--spot-interruptions-per-node-hour", "0.1"], "only with --spot"),
        (
            [
                "--tokens",
                "1B",
                "--spot",
                "--price-per-hour",
                "10",
                "--spot-interruptions-per-node-hour",
                "0",
            ],
            "spot-interruptions-per-node-hour=0.0",
        ),
        (
            ["--tokens", "1B", "--spot", "--price-per-hour", "10", "--objective", "time-to-train"],
            "--spot-interruptions-per-node-hour",
        ),
        (["--tokens", "1B", "--mtbf-gpu-hours", "0.001"], "goodput below"),
    ],
)
def test_every_bad_reliability_input_is_one_line_and_exit_2(extra, needle):
    result = runner.invoke(app, [*GPT2, *extra])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert result.stdout == "" and "Traceback" not in result.output


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"failure_rate_per_gpu_hour": -1e-5}, "failure_rate_per_gpu_hour"),
        ({"restart_overhead_s": "ten minutes"}, "restart_overhead_s"),
        ({"storage": "tape"}, "storage='tape'"),
        ({"checkpoint": "never"}, "checkpoint='never'"),
        ({"mean_time_to_coffee_s": 300}, "mean_time_to_coffee_s"),
        ({"sources": {"failure_rate_per_gpu_hour": "x"}}, "sources.failure_rate_per_node_hour"),
    ],
)
def test_the_defaults_file_is_validated_like_a_profile(change, needle):
    from storage_profiles.loader import defaults_from_dict

    data = json.loads((ROOT / "storage_profiles" / "reliability_defaults.json").read_text())
    defaults_from_dict(data)  # the shipped file is valid
    with pytest.raises(ConfigError, match=needle):
        defaults_from_dict({**data, **change}, origin="defaults.json")
