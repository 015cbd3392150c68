"""NVFP4, Transformer Engine's NVFP4BlockScaling under the same autocast as the FP8 recipes
(fp8_scaling nvfp4): the linear GEMMs in FP4 E2M1 with E4M3 scales per 16 elements on Blackwell's
FP4 tensor cores, their quantization, the weights' 4-bit copies, the hardware and stack checks and
the exports.

Expected values come from the sources: Transformer Engine's GEMM profiling example on a B300
(docs/examples/gemm_profiling/gemm_profiling.rst: per-layer GEMM times of a hidden 4096 / ffn 16384
layer at 15,872 tokens), TE's NVFP4Tensor layout (0.5 byte per element plus one scale byte per 16),
Megatron-LM's FP4 arguments (megatron/training/arguments.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models import blocks as B
from cost_models.compute import (
    fp8_cast_bytes,
    gemm_efficiency_max,
    gemm_seconds,
    short_benchmark,
)
from hardware_profiles import load_profile
from hardware_profiles.loader import profile_from_dict
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.exports import export_plan
from planner.parallel import ParallelConfig
from planner.plan import plan_from_document
from planner.run_options import RunOptions
from planner.software import software_for
from planner.sources import resolve_model

ROOT = Path(__file__).resolve().parents[1]
B300, B200, H100 = (load_profile(n) for n in ("dgx-b300", "dgx-b200", "dgx-h100"))
TE_LAYER = {"mxfp8": (8.984, 7.161), "nvfp4": (6.453, 3.764)}
"""TE's example on a B300: per-layer GEMM ms (autocast, operands quantized beforehand)."""


def _te_layer_gemms(hw, precision):
    """The example's 12 GEMMs (fprop, dgrad, wgrad of QKV, attention out, MLP up and down)."""
    m, h, f = 15872, 4096, 16384
    fprop = [(m, 3 * h, h), (m, h, h), (m, f, h), (m, h, f)]
    total = 0.0
    for rows, cols, inner in fprop:
        for shape in ((rows, cols, inner), (rows, inner, cols), (inner, cols, rows)):
            total += float(gemm_seconds(*shape, hw=hw, precision=precision, elem_bytes=2.0))
    return total


def test_fp4_gemms_run_the_measured_ratio_to_mxfp8_on_b300():
    """Operands quantized beforehand, the example's NVFP4 GEMMs take 3.764 ms a layer against
    MXFP8's 7.161 (1.90x); a short benchmark runs at the boost clock. The constant was read off the
    same example: this checks the wiring (FP4 peak, the cap, the fixed cost of each of the 12
    GEMMs), which fails if NVFP4 GEMMs ran at the FP8 peak or uncapped."""
    hw = short_benchmark(B300)
    fp8, fp4 = (_te_layer_gemms(hw, p) for p in ("fp8", "nvfp4"))
    measured = TE_LAYER["mxfp8"][1] / TE_LAYER["nvfp4"][1]
    assert fp8 / fp4 == pytest.approx(measured, rel=0.03)


def test_the_fp4_ceiling_is_the_measured_rate_over_fp8_whatever_the_fp4_peak():
    """B200's FP4 peak is 2x its FP8, B300's 2.92x; both run FP4 GEMMs at most 1.90x FP8's rate,
    so B200 keeps 0.95 of its FP4 share and B300 0.65."""
    measured = TE_LAYER["mxfp8"][1] / TE_LAYER["nvfp4"][1]
    for hw in (B200, B300):
        fp8, fp4 = (gemm_efficiency_max(hw, p) for p in ("fp8", "nvfp4"))
        rate = fp4 * hw.peak_tflops["nvfp4"] / (fp8 * hw.peak_tflops["fp8"])
        assert rate == pytest.approx(min(measured, hw.peak_tflops["nvfp4"] / hw.peak_tflops["fp8"]))


def test_quantization_costs_the_measured_ratio_to_mxfp8():
    """Autocast minus pre-quantized: 2.689 ms of NVFP4 quantization a layer against 1.823 of
    MXFP8's, whatever the stack's own cast bytes (the wiring of the constant read off it)."""
    nvfp4, mxfp8 = (fp8_cast_bytes(_llama_on(B200, s).scores.step) for s in ("nvfp4", "mxfp8"))
    (auto_mx, pre_mx), (auto_fp4, pre_fp4) = TE_LAYER["mxfp8"], TE_LAYER["nvfp4"]
    assert nvfp4 / mxfp8 == pytest.approx((auto_fp4 - pre_fp4) / (auto_mx - pre_mx), rel=1e-6)


def _llama_on(hw, scaling, *, param_gather=False, zero=1):
    cfg = ParallelConfig(
        dp=2, tp=4, pp=1, micro_batch=1, global_batch=8, seq=8192, zero=zero,
        sequence_parallel=True, precision="fp8", framework="megatron",
    )  # fmt: skip
    options = RunOptions(fp8_scaling=scaling, fp8_param_gather=param_gather)
    return estimate(resolve_model("llama3-8b"), hw, cfg, gpus=8, options=options)


def test_nvfp4_is_faster_than_mxfp8_and_gains_less_than_its_gemms():
    """Attention, the head and the memory-bound kernels stay in 16 bits and NVFP4 quantizes more,
    so the step gains less than the GEMMs' 1.90x."""
    for hw in (B200, B300):
        mx, fp4 = (_llama_on(hw, s).step_time_s for s in ("mxfp8", "nvfp4"))
        assert 1.0 < mx / fp4 < TE_LAYER["mxfp8"][1] / TE_LAYER["nvfp4"][1]


def test_the_weights_fp4_copies_take_0_5625_of_the_fp8_copies():
    """TE keeps a row- and a column-wise copy of each weight for the step: 1 byte each in FP8, 0.5
    and a scale byte per 16 elements in NVFP4."""
    fp8 = _llama_on(B200, "mxfp8")
    plain = estimate(
        resolve_model("llama3-8b"), B200, dataclasses.replace(fp8.config, precision="amp-bf16"),
        gpus=8,
    )  # fmt: skip

    def params(est):
        return est.to_document()["prediction"]["memory"]["params_bytes"]

    added = {s: params(_llama_on(B200, s)) - params(plain) for s in ("mxfp8", "nvfp4")}
    assert added["nvfp4"] / added["mxfp8"] == pytest.approx(0.5 + 1 / 16, rel=1e-6)


def test_gathered_fp4_parameters_move_0_5625_bytes_per_weight():
    assert B.quantized_bytes(_llama_on(B200, "nvfp4").software.fp8_scaling) == 0.5625
    assert B.quantized_bytes(_llama_on(B200, "mxfp8").software.fp8_scaling) == 1.0
    gathered = {}
    for scaling in ("mxfp8", "nvfp4"):
        est = _llama_on(B200, scaling, param_gather=True)
        gathered[scaling] = est.time_breakdown_s()["dp_comm"]
    assert gathered["nvfp4"] < gathered["mxfp8"]


def _refusal(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def test_nvfp4_needs_fp4_tensor_cores():
    with pytest.raises(ConfigError, match="FP4 tensor cores") as err:
        _llama_on(H100, "nvfp4")
    assert "allowed here: tensorwise, delayed" in str(err.value)
    line = _refusal(
        "estimate", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--dp", "8",
        "--precision", "fp8", "--fp8-scaling", "nvfp4",
    )  # fmt: skip
    assert "fp8_scaling=nvfp4 needs FP4 tensor cores" in line and "dgx-h100" in line


def test_only_blackwell_profiles_have_an_fp4_rate_of_at_least_twice_fp8():
    for path in sorted((ROOT / "hardware_profiles").glob("*.json")):
        profile = load_profile(path.stem)
        if "nvfp4" in profile.peak_tflops:
            assert "mxfp8" in profile.peak_tflops, path.stem
            assert profile.peak_tflops["nvfp4"] >= 2 * profile.peak_tflops["fp8"], path.stem
        else:
            assert "mxfp8" not in profile.peak_tflops, path.stem


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda p: p.pop("mxfp8"), "needs block-scaled tensor cores"),
        (lambda p: p.update(nvfp4=p["fp8"] / 2), "at least the fp8 peak"),
    ],
)
def test_a_profile_with_an_impossible_fp4_rate_is_refused(edit, message):
    doc = json.loads((ROOT / "hardware_profiles" / "dgx-b200.json").read_text())
    edit(doc["peak_tflops"])
    with pytest.raises(ConfigError, match=message):
        profile_from_dict(doc, origin="b200-edited.json")


def test_megatron_export_writes_the_fp4_arguments_not_the_fp8_ones():
    """Megatron-LM refuses --fp4-format beside --fp8-format."""
    plan = plan_from_document(_llama_on(B200, "nvfp4", param_gather=True).to_document())
    text = export_plan(plan, "megatron").text
    assert "--fp4-format e2m1" in text and "--fp4-recipe nvfp4" in text
    assert "--fp4-param-gather" in text
    assert "--fp8-format" not in text and "--fp8-recipe" not in text
    assert "--fp8-param-gather" not in text


def test_sagemaker_export_names_te_nvfp4_recipe():
    plan = plan_from_document(_llama_on(B200, "nvfp4").to_document())
    notes = export_plan(plan, "sagemaker").notes
    assert any(n.startswith("fp8: ") and "NVFP4BlockScaling()" in n for n in notes), notes


def test_a_plan_file_with_nvfp4_on_hopper_is_refused(tmp_path):
    doc = _llama_on(B200, "nvfp4").to_document()
    doc["hardware"]["name"] = "dgx-h100"
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(doc))
    line = _refusal("export", str(path), "--format", "megatron")
    assert "fp8_scaling=nvfp4 needs FP4 tensor cores" in line, line


def test_the_published_nvfp4_rows_run_the_recipe_with_bf16_parameters():
    """Megatron-Bridge's bf16_with_nvfp4_mixed: fp4 e2m1, nvfp4, fp8_param_gather False."""
    from benchmarks.published_rows import options_of

    doc = json.loads((ROOT / "validation" / "published" / "megatron.json").read_text())
    rows = [r for r in doc["runs"] if "NVFP4" in str((r.get("extras") or {}).get("fp8_recipe"))]
    assert len(rows) == 3  # GB200: 70B in 26.02 and 26.02.01, 405B in 26.02
    for row in rows:
        options = options_of(row)
        assert (options.fp8_scaling, options.fp8_param_gather) == ("nvfp4", False)


def test_megatrons_embedding_and_loss_count_as_layers_of_the_pipeline_split():
    """Megatron-Core's get_num_layers_to_build: (layers + 2) / (pp x vp) a chunk, one fewer in
    the first and the last; Llama 3.1 405B's 126 blocks over 8 x 4 and 16 x 8 chunks."""
    from planner.errors import PlannerError
    from planner.partition import embedding_and_loss_as_layers

    assert embedding_and_loss_as_layers(126, 32) == (3, *[4] * 30, 3)
    assert embedding_and_loss_as_layers(126, 128) == (0, *[1] * 126, 0)
    with pytest.raises(PlannerError, match="do not split over 40"):
        embedding_and_loss_as_layers(126, 40)
    with pytest.raises(PlannerError, match="do not split over 1 "):
        embedding_and_loss_as_layers(126, 1)


def test_the_report_names_the_fp4_peak_and_nvfp4_casts_for_an_nvfp4_plan():
    """The checklist's FP8 rule on an NVFP4 plan quotes the FP4 peak (dgx-b200: 9,000 against 2,250
    bf16) and NVFP4's cast bytes (1.475 x MXFP8's 4 + 2/32 = 5.99), not FP8's."""
    from planner.report import checklist
    from planner.report.build import Scenario, rule_context

    est = _llama_on(B200, "nvfp4")
    cfg = est.config
    scenario = Scenario(model="llama3-8b", hardware="dgx-b200", gpus=8, seq=cfg.seq)
    context = rule_context(est.model, B200, est.to_document(), scenario)
    r = checklist.fp8_gemms(context)
    assert " at nvfp4 " in r.number and "peak 9000 vs 2250 TFLOP/s" in r.number, r.number
    assert "casts 5.99 bytes per GEMM operand element (megatron, nvfp4)" in r.number, r.number


def test_nvfp4_keeps_bf16_parameters_by_default_and_recommend_leaves_userbuffers_off():
    """Megatron-Bridge's bf16_with_nvfp4_mixed: fp8_param_gather False; its NVFP4 presets force
    tp_comm_overlap off, so recommend does not choose it (the user still may)."""
    from planner.software import free_overlaps
    from frameworks import load_framework

    megatron = load_framework("megatron")
    assert megatron.fp8_param_gather  # the stack's FP8 recipes gather FP8 parameters
    assert _llama_on(B200, "nvfp4", param_gather=None).software.fp8_param_gather is False
    assert _llama_on(B200, "mxfp8", param_gather=None).software.fp8_param_gather is True
    for scaling, free in (("mxfp8", ("tp_comm_overlap",)), ("nvfp4", ())):
        options = RunOptions(fp8_scaling=scaling)
        software = _llama_on(B200, scaling, param_gather=None).software
        assert free_overlaps(software, options, precision="fp8") == free
    # the Python API lets an nvfp4 recipe stand beside bf16 training, where it quantizes nothing:
    # userbuffers stay recommend's choice there
    software = software_for("megatron", RunOptions(fp8_scaling="nvfp4"))
    bf16 = free_overlaps(software, RunOptions(fp8_scaling="nvfp4"), precision="amp-bf16")
    assert bf16 == ("tp_comm_overlap",)
    # a plan file keeps the user's FP4 parameters through the document's defaults
    doc = _llama_on(B200, "nvfp4", param_gather=True).to_document()
    assert "--fp4-param-gather" in export_plan(plan_from_document(doc), "megatron").text
    doc = _llama_on(B200, "nvfp4", param_gather=None).to_document()
    assert "--fp4-param-gather" not in export_plan(plan_from_document(doc), "megatron").text


def test_linear_inputs_are_saved_in_the_recipes_element_size():
    """TE keeps each linear layer's quantized column-wise input for the weight gradient: under
    NVFP4 0.5625 byte where FP8 keeps 1, for the QKV and fc1 inputs (replicated, h each), the
    projection's and fc2's (sharded, q and f), and an MoE layer's dispatched copies (k h)."""
    delta = (0.5 + 1 / 16) - 1.0
    llama = resolve_model("llama3-8b")
    fp4, fp8 = (B.block_table(llama, "fp8", "fused", fp8_scaling=s) for s in ("nvfp4", "mxfp8"))
    assert fp4.saved.rep - fp8.saved.rep == pytest.approx(delta * 2 * llama.hidden)
    width = llama.attn_width + llama.d_ffn
    assert fp4.saved.shard - fp8.saved.shard == pytest.approx(delta * width)
    qwen = resolve_model("qwen3-30b-a3b")
    rep = {
        s: B.moe_mla_bytes_per_token(qwen, 2.0, kernels="fused", precision="fp8", fp8_scaling=s)[0]
        for s in ("nvfp4", "mxfp8")
    }
    dispatch = rep["nvfp4"]["moe_dispatch"] - rep["mxfp8"]["moe_dispatch"]
    assert dispatch == pytest.approx(delta * qwen.moe.top_k * qwen.hidden)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda p: p.pop("mxfp8"), "needs block-scaled tensor cores (peak_tflops.mxfp8)"),
        (lambda p: p.update(nvfp4=1000.0), "and at least the fp8 peak (4500.0)"),
    ],
)
def test_the_command_line_refuses_an_impossible_fp4_rate_in_one_line(tmp_path, edit, message):
    doc = json.loads((ROOT / "hardware_profiles" / "dgx-b200.json").read_text())
    edit(doc["peak_tflops"])
    path = tmp_path / "b200-edited.json"
    path.write_text(json.dumps(doc))
    line = _refusal("estimate", "llama3-8b", "--hardware", str(path), "--gpus", "8", "--dp", "8")
    assert "peak_tflops.nvfp4=" in line and message in line, line
