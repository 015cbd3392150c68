"""benchmarks/published_rows.py: rows become estimate's inputs, and TFLOP/s-only rows get step times
through their source's FLOP convention (validation/published/FORMAT.md `tflops_convention`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import published_rows as R
from planner.run_options import RunOptions

PUBLISHED = Path(__file__).resolve().parents[1] / "validation" / "published"


def _rows_with_time_and_tflops(name: str, source: str):
    rows = json.loads((PUBLISHED / f"{name}.json").read_text())["runs"]
    return [
        r
        for r in rows
        if r["source_id"] == source
        and r["measured"].get("tflops_per_gpu")
        and R.measured_step_s(r) is not None
    ]


@pytest.mark.parametrize(
    "name,source,convention",
    [
        ("megatron", "nemo-perf-summary-24.07", "nemo"),
        ("features", "nemo-perf-2407", "nemo"),
        ("features", "nemo-perf-2504", "nemo"),
        ("deepspeed", "bigscience-tr11-176b-readme", "megatron-hfu"),
        ("deepspeed", "mtnlg-530b-2022", "megatron-hfu"),
    ],
)
def test_a_convention_reproduces_the_tflops_its_source_printed_beside_a_step_time(
    name, source, convention
):
    rows = _rows_with_time_and_tflops(name, source)
    assert rows
    for row in rows:
        flops = R.convention_flops(R.spec_of(row), row["global_batch"], row["seq"], convention)
        tflops = flops / R.measured_step_s(row) / row["gpus"] / 1e12
        assert tflops == pytest.approx(row["measured"]["tflops_per_gpu"], rel=0.011), row["id"]


def test_tflops_only_rows_get_a_step_time_from_their_convention():
    cases = [c for c in R.load(["features"]) if c.source == "nemo-longseq-h100"]
    assert cases and all(c.measured_s and c.measured_s > 0 for c in cases)
    # 4M tokens per step at every length: longer sequences do more attention FLOPs per token, so the
    # GPU-seconds per step grow with the sequence
    gpu_seconds = [c.measured_s * c.row["gpus"] for c in sorted(cases, key=lambda c: c.config.seq)]
    assert all(b > a for a, b in zip(gpu_seconds, gpu_seconds[1:]))


def test_every_convention_named_by_a_source_is_known():
    for path in PUBLISHED.glob("*.json"):
        for sid, src in json.loads(path.read_text())["sources"].items():
            if "tflops_convention" in src:
                assert src["tflops_convention"] in ("nemo", "megatron-hfu"), (path.name, sid)


def test_a_row_the_planner_cannot_represent_is_kept_with_its_reason():
    rows = json.loads((PUBLISHED / "megatron.json").read_text())["runs"]
    bad = dict(
        rows[0], tp=3
    )  # 3 does not divide the heads... the row stays, with its one-line reason
    case = R.Case(
        row=bad,
        file="megatron",
        spec=None,
        hardware=None,
        config=None,
        options={},
        measured_s=None,
        error="tp=3 is invalid",
    )
    assert case.error and case.config is None


def test_extras_become_software_options():
    row = {
        "attention": "triton",
        "extras": {
            "loss_fn": "fused_crossentropy",
            "grad_reduce_dtype": "bf16",
            "overlap_grad_reduce": False,
        },
    }
    assert R.options_of(row) == RunOptions(
        attention="triton",
        dropout=False,
        overlap_grad_reduce=False,
        grad_reduce_dtype="bf16",
        loss="fused",
    )


@pytest.mark.parametrize(
    "precision,extras,expected",
    [
        ("amp-bf16", {"distributed_optimizer": "distributed_fused_adam"}, "remainder"),
        ("fp8", {"distributed_optimizer": "distributed_fused_adam (ZeRO-1 style)"}, "remainder"),
        # NeMo 1.x stores full fp32 masters when the weights are FP8 (store_params) and Apex needs bf16 weights
        ("fp8", {"distributed_optimizer": "distributed_fused_adam", "fp8_params": True}, None),
        ("amp-fp16", {"distributed_optimizer": "distributed_fused_adam"}, None),
        ("amp-bf16", {"distributed_optimizer": "Megatron-Core distributed optimizer"}, None),
    ],
)
def test_nemo_distributed_fused_adam_rows_keep_master_weights_as_remainders(
    precision, extras, expected
):
    assert R.options_of({"precision": precision, "extras": extras}).master_weights == expected


@pytest.mark.parametrize(
    "precision,extras,expected",
    [
        # NeMo 1.x gathers FP8 weights only with fp8_params, off by default (its generic 24.07
        # launcher configs do not set it)
        ("fp8", {"distributed_optimizer": "distributed_fused_adam"}, False),
        ("fp8", {"distributed_optimizer": "distributed_fused_adam", "fp8_params": True}, True),
        # not NeMo 1.x: the stack's default decides (None)
        ("fp8", {"distributed_optimizer": "Megatron-Core distributed optimizer"}, None),
        ("amp-bf16", {"distributed_optimizer": "distributed_fused_adam"}, None),
    ],
)
def test_nemo_1x_rows_gather_fp8_weights_only_with_fp8_params(precision, extras, expected):
    assert R.options_of({"precision": precision, "extras": extras}).fp8_param_gather is expected


def test_no_run_is_counted_twice_under_two_precision_labels():
    """Megatron has no pure-bf16 mode (frameworks/megatron.json state_bytes): a row labelled bf16 is the
    same run as its amp-bf16 twin, and counting both gives that run two votes with two settings."""
    from benchmarks import accuracy_frameworks as A
    from benchmarks import stack_predictions as P

    def key(case):
        k = list(P._identity(case))
        if case.row["framework"] == "megatron" and k[9] == "bf16":
            k[9] = "amp-bf16"
        return tuple(k)

    keys = [key(c) for c in P.unique(R.load(A.DEFAULT_FILES))]
    twins = {k for k in keys if keys.count(k) > 1}
    assert not twins, sorted(twins)[:3]


def test_the_blackwell_bf16_rate_rests_on_more_than_one_publication():
    """blackwell.gemm_efficiency_max is fitted from the BF16 runs on B200/GB200 (benchmarks/calibrate_frameworks.py):
    with a single publication behind it, leaving that source out leaves the rate unidentified and the held-out
    rows unchecked (docs/cost-model.md); the runs counted are the ones the fit uses."""
    from benchmarks.calibrate_frameworks import BLACKWELL, FILES, usable
    from benchmarks.stack_predictions import unique

    sources = {
        c.source
        for c in usable(unique(R.load(FILES)))
        if c.row["gpu"].split()[0] in BLACKWELL and c.row["precision"] in ("amp-bf16", "bf16")
    }
    assert len(sources) >= 2, sorted(sources)


def test_measured_memory_is_compared_with_the_same_quantity():
    """accuracy_frameworks compares a publication's memory with the quantity it measured: reserved memory with
    the peak plus the allocator's overhead (needed bytes less the CUDA context), nvidia-smi with needed bytes."""
    from benchmarks import published_rows as R
    from benchmarks.accuracy_frameworks import memory_summary
    from benchmarks.stack_predictions import predict, unique
    from cost_models.memory import cuda_context_bytes
    from planner.estimate import estimate

    cases = [
        c for c in unique(R.load(("torchtitan", "deepspeed"))) if c.row.get("measured_memory_gib")
    ]
    kinds = {c.row["memory_kind"] for c in cases}
    assert {"reserved", "nvidia-smi"} <= kinds
    for kind in ("reserved", "nvidia-smi"):
        case = next(c for c in cases if c.row["memory_kind"] == kind)
        est = estimate(
            case.spec, case.hardware, case.config, gpus=case.row["gpus"], options=case.options
        )
        predicted = est.needed_bytes - (
            cuda_context_bytes(case.hardware) if kind == "reserved" else 0.0
        )
        r = predict(case)
        assert r.memory_kind == kind
        assert r.memory_error == pytest.approx(
            predicted / (case.row["measured_memory_gib"] * 2**30) - 1.0, rel=1e-12
        )
    summary = memory_summary([predict(c) for c in cases[:10]])
    assert all(s["rows"] >= 1 and s["mape"] >= abs(s["mean"]) for s in summary.values())


def test_a_deepspeed_partition_method_becomes_the_stage_split():
    rows = json.loads((PUBLISHED / "deepspeed.json").read_text())["runs"]
    bloom = next(r for r in rows if r["id"] == "bloom176b-gbs2048-mbs2")
    assert bloom["extras"]["pp_partition_method"].startswith("type:transformer|embedding")
    assert R.config_of(bloom).stages == (5,) + (6,) * 10 + (5,)
    plain = dict(
        bloom, extras={k: v for k, v in bloom["extras"].items() if k != "pp_partition_method"}
    )
    assert R.config_of(plain).stages == ()


def test_published_stage_sizes_and_the_default_partition_reach_the_config():
    rows = {r["id"]: r for r in json.loads((PUBLISHED / "deepspeed.json").read_text())["runs"]}
    assert R.config_of(rows["glm130b-768gpu-tp4-pp8-mb1-gbs4224"]).stages == (8,) + (9,) * 6 + (8,)
    uneven = rows["bloomprq-02-26-h13824-l78-a96-dp8-tp4-pp12-mb2-gbs2048"]
    assert uneven["extras"]["pp_partition_method"].startswith("type:transformer (")
    assert R.config_of(uneven).stages == (7,) * 11 + (1,)


def test_a_row_can_say_its_run_built_no_mtp_module():
    """NeMo AutoModel's DeepSeek-V3 had no multi-token prediction when its table was measured: the rows' arch
    sets mtp_modules 0 over the catalog's 1 (and so pass torchtitan-class stacks' mtp_with_pp_or_cp rule)."""
    rows = {r["id"]: r for r in json.loads((PUBLISHED / "moe.json").read_text())["runs"]}
    row = rows["automodel-dsv3-h100-1024"]
    assert row["model"] == "deepseek-v3" and R.spec_of(row).mtp_modules == 0
    assert R.spec_of(dict(row, arch=None)).mtp_modules == 1
