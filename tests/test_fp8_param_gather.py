"""FP8 parameter all-gathers (RunOptions.fp8_param_gather; Megatron-Core's --fp8-param-gather):
the run option added end to end as issue 29's demonstration."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cost_models import comm as C
from cost_models import moe as MO
from frameworks.loader import FRAMEWORK_DIR as FRAMEWORKS
from frameworks.loader import framework_from_dict
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.exports import export_plan
from planner.parallel import ParallelConfig
from planner.plan import plan_from_document, run_options
from planner.run_options import RunOptions
from planner.sources import resolve_model
from tests.fixtures.cli import one_line

runner = CliRunner()
SPEC = resolve_model("llama3-8b")

# Llama 3 8B (Meta's config.json: hidden 4096, 32 heads of 128, 8 KV heads, FFN 14336, 32 layers,
# vocabulary 128256, untied): per block q and o 4096 x 4096, k and v 4096 x 1024, gate, up and
# down 4096 x 14336, and two RMSNorm weights of 4096; outside the blocks the two embedding tables
# and the final norm. The GEMM weights go FP8, the norms and embeddings stay 16-bit.
GEMM_WEIGHTS = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
OTHER_PARAMS = 2 * 128256 * 4096 + 65 * 4096


def run(fp8_param_gather: bool, zero: int = 1, dp: int = 8):
    cfg = ParallelConfig(
        dp=dp, tp=1, pp=1, micro_batch=1, global_batch=64, seq=8192, zero=zero, precision="fp8"
    )
    options = RunOptions(fp8_param_gather=fp8_param_gather)
    return estimate(SPEC, "p5.48xlarge", cfg, gpus=dp, options=options)


def test_the_model_has_the_weights_counted_here():
    assert GEMM_WEIGHTS + OTHER_PARAMS == 8_030_261_248  # Meta's published count


def test_a_rank_holds_the_gemm_weights_and_the_rest():
    step = run(True).scores.step
    params = MO.rank_params(step, step.blocks_most, True, True)
    assert float(params.sixteen_bit[0]) == OTHER_PARAMS
    assert float(params.total[0]) == GEMM_WEIGHTS + OTHER_PARAMS


def test_the_gemm_weights_are_gathered_in_one_byte_the_rest_in_two():
    for on, expected in ((True, GEMM_WEIGHTS + 2 * OTHER_PARAMS), (False, 2 * (8_030_261_248))):
        step = run(on).scores.step
        params = MO.rank_params(step, step.blocks_most, True, True)
        gathered = C._gathered_bytes(step, params.total, params.dense_gemm + params.expert, 2.0)
        assert float(gathered[0]) == expected


def test_megatron_holds_each_gemm_weight_as_one_fp8_tensor():
    # bf16 parameter (2) and Transformer Engine's two FP8 copies (2) become an FP8 parameter (1)
    # and its cached transpose (1): two bytes less per GEMM weight, unsharded under ZeRO-1
    saved = run(False).memory()["params_bytes"] - run(True).memory()["params_bytes"]
    assert saved == pytest.approx(2 * GEMM_WEIGHTS, abs=2)


def test_the_step_gathers_less_and_is_no_slower():
    off, on = run(False), run(True)
    assert on.step_time_s <= off.step_time_s
    assert on.time_breakdown_s()["dp_comm"] < off.time_breakdown_s()["dp_comm"]


def test_megatron_runs_it_by_default_as_nvidias_fp8_recipes_do():
    default = estimate(SPEC, "p5.48xlarge", run(True).config, gpus=8)
    assert default.software.fp8_param_gather is True
    assert default.step_time_s == run(True).step_time_s


def test_the_plan_records_it_reads_it_back_and_exports_it():
    on, off = run(True).to_document(), run(False).to_document()
    assert on["software"]["fp8_param_gather"] is True
    assert off["software"]["fp8_param_gather"] is False
    assert run_options(on).fp8_param_gather is None  # megatron's default: not the run's choice
    assert run_options(off).fp8_param_gather is False
    assert "--fp8-param-gather" in export_plan(plan_from_document(on), "megatron").text
    assert "--fp8-param-gather" not in export_plan(plan_from_document(off), "megatron").text


ESTIMATE = ["estimate", "llama3-8b", "--hardware", "p5.48xlarge", "--gpus", "8", "--dp", "8"]


def test_the_command_line_takes_it():
    res = runner.invoke(
        app, [*ESTIMATE, "--precision", "fp8", "--zero", "1", "--fp8-param-gather", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["software"]["fp8_param_gather"] is True


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--precision", "bf16"], ["--fp8-param-gather", "only with --precision fp8"]),
        (["--precision", "fp8", "--zero", "0"], ["zero", "fp8_param_gather"]),
        (
            ["--precision", "fp8", "--zero", "1", "--framework", "deepspeed"],
            ["deepspeed", "all-gathers its parameters in their 16-bit dtype"],
        ),
    ],
)
def test_it_is_refused_where_it_means_nothing(args, needles):
    one_line(runner.invoke(app, [*ESTIMATE, *args, "--fp8-param-gather"]), *needles)


def test_recommend_searches_only_plans_that_gather():
    res = runner.invoke(
        app,
        [
            "recommend",
            "llama3-8b",
            "--hardware",
            "p5.48xlarge",
            "--gpus",
            "16",
            "--precision",
            "fp8",
            "--fp8-param-gather",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    plans = [out["best"], *out["alternatives"]]
    assert plans and all(p["plan"]["zero"] >= 1 for p in plans)
    assert all(p["software"]["fp8_param_gather"] is True for p in plans)


def test_without_the_distributed_optimizer_megatron_keeps_bf16_weights_and_fp8_copies():
    # Megatron-LM refuses --fp8-param-gather without its distributed optimizer: ZeRO-0 runs keep
    # the bf16 weights and Transformer Engine's two FP8 copies, two bytes more per GEMM weight
    plain = run(None, zero=0)
    assert plain.software.fp8_param_gather is True  # the default, which ZeRO-0 cannot run
    extra = plain.memory()["params_bytes"] - run(None, zero=1).memory()["params_bytes"]
    assert extra == pytest.approx(2 * GEMM_WEIGHTS, abs=2)
    assert (
        "--fp8-param-gather"
        not in export_plan(plan_from_document(plain.to_document()), "megatron").text
    )


def test_a_plan_file_without_the_key_exports_its_stacks_default():
    document = run(None).to_document()
    del document["software"]["fp8_param_gather"]  # a plan written before the option
    assert "--fp8-param-gather" in export_plan(plan_from_document(document), "megatron").text


def test_the_python_api_refuses_it_without_fp8():
    cfg = ParallelConfig(dp=8, tp=1, pp=1, micro_batch=1, global_batch=64, seq=8192, zero=1)
    with pytest.raises(ConfigError, match="--fp8-param-gather only with --precision fp8"):
        estimate(SPEC, "p5.48xlarge", cfg, gpus=8, options=RunOptions(fp8_param_gather=True))


def test_a_default_the_stack_cannot_run_is_refused_in_its_profile():
    document = json.loads((FRAMEWORKS / "torchtitan.json").read_text())
    document["fp8_param_gather"] = True
    with pytest.raises(ConfigError, match="fp8_param_gather=True is invalid"):
        framework_from_dict(document, origin="torchtitan.json")
