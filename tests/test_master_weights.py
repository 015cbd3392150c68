"""Master weights kept as 16-bit remainders (Apex DistributedFusedAdam / Transformer Engine FusedAdam
store_param_remainders): 2 bytes per parameter instead of 4, only with bf16 parameters, only where the
framework's optimizer can."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.software import software_for
from planner.parallel import ParallelConfig
from planner.run_options import RunOptions

CFG = dict(dp=8, zero=1, micro_batch=1, global_batch=64, seq=4096, framework="megatron")


def _est(precision="amp-bf16", **kw):
    return estimate(
        "llama3-8b",
        "p5.48xlarge",
        ParallelConfig(precision=precision, **CFG),
        gpus=8,
        options=RunOptions(**kw),
    )


def test_remainders_save_two_bytes_per_parameter_of_the_optimizer_shard():
    full, rem = _est(), _est(master_weights="remainder")
    n = full.params
    # Adam: master 4 + m 4 + v 4 = 12 bytes over dp 8, against 2 + 4 + 4 = 10
    assert full.memory()["optimizer_bytes"] == pytest.approx(12 * n / 8, rel=1e-6)
    assert rem.memory()["optimizer_bytes"] == pytest.approx(10 * n / 8, rel=1e-6)
    assert rem.memory()["params_bytes"] == full.memory()["params_bytes"]
    assert rem.memory()["grads_bytes"] == full.memory()["grads_bytes"]
    assert rem.to_document()["software"]["master_weights"] == "remainder"
    assert full.to_document()["software"]["master_weights"] == "fp32"


def test_state_bytes_keep_the_fp32_master_whole_for_fp32_runs():
    sw = software_for("megatron", options=RunOptions(master_weights="remainder"))
    # fp32 parameters are their own master copy: there is nothing to split
    assert sw.state_bytes("fp32").master == 0
    assert sw.state_bytes("amp-bf16").master == 2


def test_fp16_parameters_cannot_hold_the_high_half_of_an_fp32_value():
    with pytest.raises(ConfigError, match="needs bf16 parameters"):
        _est(precision="amp-fp16", master_weights="remainder")


LLAMA3_8B_PARAMS = 8_030_261_248
"""Llama 3 8B's parameters (Meta's model card: 8.03B; the catalog's count)."""
LLAMA3_8B_NON_GEMM = 2 * 128_256 * 4_096 + (2 * 32 + 1) * 4_096
"""Its weights outside the GEMMs of the blocks: the untied embedding and head (vocab 128256 x hidden
4096 each) and the 65 RMSNorm scales (config.json of meta-llama/Meta-Llama-3-8B)."""


def test_fp8_parameters_keep_whole_masters_beside_remainders():
    """An FP8 GEMM weight has no bf16 high half for a remainder to complete: the optimizer keeps its
    whole fp32 master (Transformer Engine FusedAdam keeps remainders for bf16 parameters only);
    embeddings, head and norms keep remainders."""
    fp8 = dict(precision="fp8", master_weights="remainder")
    held, bf16_weights = _est(**fp8), _est(**fp8, fp8_param_gather=False)
    assert held.params == LLAMA3_8B_PARAMS
    gemm = LLAMA3_8B_PARAMS - LLAMA3_8B_NON_GEMM
    # Adam over dp 8: GEMM weights 4 + 4 + 4, the others 2 + 4 + 4
    expected = (12 * gemm + 10 * LLAMA3_8B_NON_GEMM) / 8
    assert held.memory()["optimizer_bytes"] == pytest.approx(expected, rel=1e-6)
    assert bf16_weights.memory()["optimizer_bytes"] == pytest.approx(10 * LLAMA3_8B_PARAMS / 8)


@pytest.mark.parametrize("framework", ["torchtitan", "fsdp", "deepspeed"])
def test_frameworks_without_remainder_storage_refuse_it(framework):
    with pytest.raises(ConfigError, match=f"{framework} keeps full fp32 master weights"):
        software_for(framework, options=RunOptions(master_weights="remainder"))


def test_cli_master_weights_round_trip_and_errors(tmp_path):
    runner = CliRunner()
    base = [
        "estimate",
        "llama3-8b",
        "--hardware",
        "p5.48xlarge",
        "--gpus",
        "8",
        "--dp",
        "8",
        "--zero",
        "1",
    ]
    ok = runner.invoke(app, base + ["--master-weights", "remainder", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["software"]["master_weights"] == "remainder"
    for extra, words in (
        (["--master-weights", "half"], "master_weights='half' is invalid"),
        (["--master-weights", "remainder", "--precision", "amp-fp16"], "needs bf16 parameters"),
        (["--master-weights", "remainder", "--framework", "fsdp"], "fsdp keeps full fp32"),
    ):
        bad = runner.invoke(app, base + extra)
        assert bad.exit_code == 2, (extra, bad.output)
        assert words in bad.output and "Traceback" not in bad.output


def test_cli_kernels_swaps_the_block_implementation_and_a_search_keeps_it(tmp_path):
    """`--kernels eager`: a DeepSpeed ZeRO-3 run of Hugging Face modules is costed with the eager block
    table (more memory-bound kernels, slower than Megatron-DeepSpeed's fused ones), and the plan file says so,
    so `explain --search` re-searches with the same modules."""
    from planner.explain import _software_options

    runner = CliRunner()
    base = [
        "estimate",
        "llama3-8b",
        "--hardware",
        "p4d.24xlarge",
        "--gpus",
        "16",
        "--dp",
        "16",
        "--zero",
        "3",
        "--framework",
        "deepspeed",
        "--recompute",
        "full",
        "--json",
    ]
    fused = json.loads(runner.invoke(app, base).stdout)
    eager = json.loads(runner.invoke(app, base + ["--kernels", "eager"]).stdout)
    assert fused["software"]["kernels"] == "fused" and eager["software"]["kernels"] == "eager"
    assert eager["prediction"]["step_time_s"] > fused["prediction"]["step_time_s"]
    assert _software_options(eager).kernels == "eager"
    assert (
        "kernels" not in _software_options(fused).chosen()
    )  # the framework's own modules: nothing to carry
    out = tmp_path / "plan.json"
    rec = runner.invoke(
        app,
        [
            "recommend",
            "llama3-8b",
            "--hardware",
            "p4d.24xlarge",
            "--gpus",
            "16",
            "--framework",
            "deepspeed",
            "--kernels",
            "eager",
            "--top",
            "1",
            "--out",
            str(out),
        ],
    )
    assert rec.exit_code == 0, rec.output
    assert json.loads(out.read_text())["software"]["kernels"] == "eager"
    bad = runner.invoke(app, base + ["--kernels", "hf"])
    assert (
        bad.exit_code == 2
        and "kernels='hf' is invalid" in bad.output
        and "Traceback" not in bad.output
    )
