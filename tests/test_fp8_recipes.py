"""FP8 scaling recipes: which each stack runs (capabilities.fp8_scalings), what its export
writes, and Transformer Engine's delayed scaling, an amax all-reduce over the pipeline stage's ranks
after each forward and backward of each model chunk (cost_models.comm.fp8_amax_reduction_seconds).

Expected counts come from the stacks' code: TE 1.6 fp8.py reduces at the outermost fp8_autocast
exit and at the end of its region's backward (async_op=False), and Megatron-Core's
TransformerBlock wraps each chunk's blocks in one fp8_autocast whose group is
get_amax_reduction_group (tensor x data x context parallel ranks of one stage)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models import comm as C
from frameworks.loader import framework_from_dict
from hardware_profiles import load_profile
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.plan import Plan, plan_from_document
from planner.exports import export_plan
from planner.run_options import RunOptions
from planner.sources import resolve_model

HW = load_profile("dgx-h100")
SPEC = resolve_model("gpt3-175b")
A_IN, A_OUT = HW.intra_node_latency_us * 1e-6, HW.inter_node_latency_us * 1e-6


def run(scaling="delayed", *, dp=4, v=12, precision="fp8", place="PDT", cp=1, hw=HW):
    """GPT-3 175B as DGX Cloud's NeMo recipe lays it out: tp 4, pp 8, 12 chunks of one block."""
    interleaved = v > 1
    cfg = ParallelConfig(
        dp=dp,
        tp=4,
        pp=8,
        cp=cp,
        micro_batch=1,
        global_batch=64 * dp,
        seq=2048,
        schedule="interleaved-1f1b" if interleaved else "1f1b",
        virtual_stages=v,
        zero=1,
        sequence_parallel=True,
        precision=precision,
        framework="megatron",
        placement=place,
    )
    options = RunOptions(fp8_scaling=scaling if precision == "fp8" else None)
    return estimate(SPEC, hw, cfg, gpus=dp * 32 * cp, options=options)


def amax_s(est) -> float:
    return float(C.fp8_amax_reduction_seconds(est.scores.step)[0])


def test_one_all_reduce_per_chunk_forward_and_backward():
    """64 micro-batches x 12 chunks x (forward + backward) = 1,536 reductions per step, each over
    the 16 ranks of a stage (tp 4 x dp 4: two nodes of 8), latency-bound: NCCL's tree inside the
    node (2 log2 8 = 6 NVLink steps) and across the two nodes (2 log2 2 = 2 network steps)."""
    one = 6 * A_IN + 2 * A_OUT
    assert amax_s(run()) == pytest.approx(2 * 64 * 12 * one, rel=0.02)


def test_the_group_spans_as_many_nodes_as_the_placement_puts_it_on():
    """Pipeline ranks inside the node (DPT: tensor, then pipeline, then data): a stage's 16 ranks
    are 4 per node over 4 nodes, 2 log2 4 = 4 steps on each side."""
    one = 4 * A_IN + 4 * A_OUT
    assert amax_s(run(place="DPT")) == pytest.approx(2 * 64 * 12 * one, rel=0.02)


def test_context_parallel_ranks_are_in_the_group():
    """cp 2 (PDCT): a stage's 32 ranks are 8 per node (tensor and context) over 4 nodes."""
    one = 6 * A_IN + 4 * A_OUT
    assert amax_s(run(cp=2, place="PDCT")) == pytest.approx(2 * 64 * 12 * one, rel=0.02)


def test_a_stage_inside_one_nvlink_domain_never_crosses_the_network():
    """GB200 NVL72 trays of 4 GPUs: a 128-GPU job fills 64 of each rack's 72, so a stage's 16
    contiguous ranks share NVLink although they sit on 4 hosts: NCCL's tree over 16, 2 log2 16 = 8
    NVLink steps and no network step."""
    gb200 = load_profile("p6e-gb200.36xlarge")
    one = 8 * gb200.intra_node_latency_us * 1e-6
    assert amax_s(run(hw=gb200)) == pytest.approx(2 * 64 * 12 * one, rel=0.02)


def test_without_the_interleaved_schedule_one_chunk_per_rank():
    """1F1B: one region per rank, 64 micro-batches x (forward + backward) = 128 reductions."""
    one = 6 * A_IN + 2 * A_OUT
    assert amax_s(run(v=1)) == pytest.approx(2 * 64 * one, rel=0.02)


def test_the_group_is_the_stage_and_grows_with_data_parallelism():
    """dp 2: the stage's 8 ranks fill one node (6 NVLink steps, no network); dp 32: 128 ranks on 16
    nodes (6 NVLink steps and NCCL's tree over 16 nodes, 2 log2 16 = 8 network steps)."""
    assert amax_s(run(dp=2)) == pytest.approx(2 * 64 * 12 * 6 * A_IN, rel=0.02)
    assert amax_s(run(dp=32)) == pytest.approx(2 * 64 * 12 * (6 * A_IN + 8 * A_OUT), rel=0.02)


def test_only_delayed_scaling_pays_it():
    assert amax_s(run("tensorwise")) == 0.0
    assert amax_s(run(None, precision="amp-bf16")) == 0.0


def test_each_stack_runs_its_own_recipes():
    """Megatron-LM's --fp8-recipe has no torchao rowwise; Accelerate's and Composer's Transformer
    Engine path builds DelayedScaling, so FSDP plans are delayed by default and only so."""
    with pytest.raises(ConfigError, match="fp8_scaling=rowwise.*allowed: tensorwise, delayed"):
        run("rowwise")
    fsdp = ParallelConfig(
        dp=8, tp=1, pp=1, micro_batch=1, global_batch=16, seq=2048, zero=3,
        precision="fp8", framework="fsdp",
    )  # fmt: skip
    llama = resolve_model("llama3-8b")
    est = estimate(llama, HW, fsdp, gpus=8)
    assert est.software.fp8_scaling == "delayed"
    # the whole model is one autocast region over the 8 ranks: 2 micro-batches x 2 reductions
    one = 6 * A_IN
    assert amax_s(est) == pytest.approx(2 * 2 * one, rel=0.05)
    with pytest.raises(ConfigError, match="fsdp runs the FP8 recipes delayed"):
        estimate(llama, HW, fsdp, gpus=8, options=RunOptions(fp8_scaling="tensorwise"))


def test_the_step_waits_for_it_on_the_timeline_and_in_the_closed_form():
    delayed, current = run(), run("tensorwise")
    added = amax_s(delayed)
    assert added > 0.05  # 1,536 reductions of about 48 us (test_one_all_reduce_per_chunk_...)
    assert delayed.step_time_s - current.step_time_s == pytest.approx(added, rel=1e-6)
    closed = float(delayed.scores.closed_form_step_s[0])
    closed_current = float(current.scores.closed_form_step_s[0])
    assert closed - closed_current == pytest.approx(added, rel=1e-6)
    breakdown = delayed.time_breakdown_s()
    assert breakdown["dp_comm"] - current.time_breakdown_s()["dp_comm"] == pytest.approx(added)


def _refusal(*args: str) -> str:
    """The one line a refused command prints (exit 2)."""
    result = CliRunner().invoke(app, list(args))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def _estimate_delayed(framework: str) -> str:
    return _refusal(
        "estimate", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--dp", "8",
        "--framework", framework, "--precision", "fp8", "--fp8-scaling", "delayed",
    )  # fmt: skip


def test_a_stack_without_transformer_engine_refuses_delayed_scaling():
    line = _estimate_delayed("torchtitan")
    assert "fp8_scaling=delayed" in line and "allowed" in line


def test_a_stack_without_fp8_says_so_first():
    line = _estimate_delayed("deepspeed")
    assert "fp8_scaling" not in line and "amp-bf16" in line


def test_export_command_refuses_a_recipe_the_plans_stack_does_not_run(tmp_path):
    document = _fp8_plan("megatron", zero=1)
    document["software"]["fp8_scaling"] = "rowwise"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    line = _refusal("export", str(path), "--format", "megatron")
    assert "fp8_scaling=rowwise: megatron runs the FP8 recipes" in line


def test_megatron_export_names_the_recipe():
    for scaling in ("delayed", "tensorwise"):
        plan: Plan = plan_from_document(run(scaling).to_document())
        assert f"--fp8-recipe {scaling}" in export_plan(plan, "megatron").text


def test_torchtitan_export_says_its_converter_scales_by_row():
    cfg = ParallelConfig(
        dp=8, tp=1, pp=1, micro_batch=1, global_batch=16, seq=2048, zero=3,
        precision="fp8", framework="torchtitan",
    )  # fmt: skip
    llama = resolve_model("llama3-8b")
    for scaling, noted in (("tensorwise", True), ("rowwise", False)):
        est = estimate(llama, HW, cfg, gpus=8, options=RunOptions(fp8_scaling=scaling))
        notes = export_plan(plan_from_document(est.to_document()), "torchtitan").notes
        assert any(n.startswith(f"fp8_scaling={scaling}: ") for n in notes) is noted


def _fp8_plan(framework: str, scaling=None, **cfg):
    shape = dict(dp=8, tp=1, pp=1, micro_batch=1, global_batch=16, seq=2048, zero=3)
    shape.update(cfg)
    config = ParallelConfig(**shape, precision="fp8", framework=framework)
    options = RunOptions(fp8_scaling=scaling)
    est = estimate(resolve_model("llama3-8b"), HW, config, gpus=8, options=options)
    return est.to_document()


def test_export_to_another_stack_keeps_the_recipe_or_says_it_changes():
    """fsdp's delayed recipe is one Megatron runs: kept, and written; Megatron's tensorwise is not
    one fsdp runs: the export says it becomes delayed."""
    to_megatron = export_plan(plan_from_document(_fp8_plan("fsdp")), "megatron")
    assert "--fp8-recipe delayed" in to_megatron.text
    assert not any("fp8_scaling" in n for n in to_megatron.notes)
    to_fsdp = export_plan(plan_from_document(_fp8_plan("megatron", zero=1)), "fsdp")
    assert any("fp8_scaling tensorwise -> delayed" in n for n in to_fsdp.notes)


def test_a_plan_file_with_a_recipe_its_stack_does_not_run_is_refused():
    """A plan file written before the stacks' recipes were checked (Megatron rowwise)."""
    document = _fp8_plan("megatron", zero=1)
    document["software"]["fp8_scaling"] = "rowwise"
    with pytest.raises(
        ConfigError, match="fp8_scaling=rowwise: megatron runs the FP8 recipes"
    ) as err:
        export_plan(plan_from_document(document), "megatron")
    assert "\n" not in str(err.value)


def test_the_torchtitan_note_reads_the_stack_default_without_a_software_block():
    document = _fp8_plan("torchtitan")
    document.pop("software")
    notes = export_plan(plan_from_document(document), "torchtitan").notes
    assert any(n.startswith("fp8_scaling=tensorwise: ") for n in notes)


def test_a_profile_whose_default_recipe_it_does_not_run_is_refused():
    path = Path(__file__).resolve().parent.parent / "frameworks" / "fsdp.json"
    doc = json.loads(path.read_text())
    doc.pop("fp8_scaling")
    doc["sources"].pop("fp8_scaling", None)
    with pytest.raises(ConfigError, match="fp8_scaling") as err:
        framework_from_dict(doc, origin="fsdp.json")
    assert "one of capabilities.fp8_scalings (delayed)" in str(err.value)


def test_a_plan_not_re_estimated_on_the_target_still_runs_the_recipe_its_note_says(monkeypatch):
    """Where the target cannot re-estimate the plan (a dimension not costed there), the document
    keeps its prediction but takes the recipe the note names, so the script writes that one."""

    def not_costed(*args, **kwargs):
        raise ConfigError("experts", 1, "a dimension costed on the target")

    document = _fp8_plan("torchtitan", scaling="rowwise")
    monkeypatch.setattr(importlib.import_module("planner.exports.retarget"), "estimate", not_costed)
    export = export_plan(plan_from_document(document), "megatron")
    assert any("fp8_scaling rowwise -> tensorwise" in n for n in export.notes)
    assert "--fp8-recipe tensorwise" in export.text


# ---------------------------------------------------------------------------- MXFP8 (block scaling)

B200 = load_profile("dgx-b200")
ROOT = Path(__file__).resolve().parents[1]


def _llama_on(hw, scaling, framework="megatron", sequence_parallel=True):
    cfg = ParallelConfig(
        dp=2, tp=4, pp=1, micro_batch=1, global_batch=8, seq=8192, zero=1,
        sequence_parallel=sequence_parallel, precision="fp8", framework=framework,
    )  # fmt: skip
    return estimate(
        resolve_model("llama3-8b"), hw, cfg, gpus=8, options=RunOptions(fp8_scaling=scaling)
    )


def test_mxfp8_casts_carry_one_e8m0_scale_per_32_elements_in_each_orientation():
    """OCP MX v1.0: one 8-bit shared scale per 32-element block; TE's MXFP8 keeps a row-wise and a
    column-wise copy, each with its scales, beside the stack's cast traffic
    (frameworks/megatron.json)."""
    from cost_models.compute import fp8_cast_bytes

    per_element = json.loads((ROOT / "frameworks" / "megatron.json").read_text())[
        "fp8_cast_bytes_per_element"
    ]
    mx, tensorwise = (
        fp8_cast_bytes(_llama_on(B200, s).scores.step) for s in ("mxfp8", "tensorwise")
    )
    assert tensorwise == per_element and mx == per_element + 2 * (1 / 32)  # two orientations


def test_mxfp8_costs_its_scales_and_no_amax_reduction():
    """Against tensorwise scaling MXFP8 pays its scales' cast traffic and, under sequence
    parallelism, the backward's second gathered orientation of the output gradient (Transformer
    Engine gathers MXFP8's row- and column-wise data, a tensorwise copy row-wise only:
    cost_models.comm.tp_pair_seconds); no amax reduction."""
    mx, tensorwise = (_llama_on(B200, s, sequence_parallel=False) for s in ("mxfp8", "tensorwise"))
    assert 0 < mx.step_time_s - tensorwise.step_time_s < 0.005 * tensorwise.step_time_s
    assert amax_s(mx) == 0.0
    mx_sp, tensorwise_sp = (_llama_on(B200, s) for s in ("mxfp8", "tensorwise"))
    gathered = (
        mx_sp.to_document()["prediction"]["time_breakdown_s"]["tp_comm"]
        - tensorwise_sp.to_document()["prediction"]["time_breakdown_s"]["tp_comm"]
    )
    assert gathered > 0 and mx_sp.step_time_s - tensorwise_sp.step_time_s > gathered / 2


def test_mxfp8_needs_block_scaled_tensor_cores():
    with pytest.raises(ConfigError, match="block-scaled") as err:
        _llama_on(HW, "mxfp8")
    assert "allowed here: tensorwise, delayed" in str(err.value)
    line = _refusal(
        "recommend", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
        "--precision", "fp8", "--fp8-scaling", "mxfp8",
    )  # fmt: skip
    assert "fp8_scaling=mxfp8 needs block-scaled FP8 tensor cores" in line and "dgx-h100" in line


def test_only_blackwell_profiles_say_block_scaled_fp8_at_the_fp8_rate():
    for path in sorted((ROOT / "hardware_profiles").glob("*.json")):
        profile = load_profile(path.stem)
        blackwell = "B200" in profile.device or "B300" in profile.device
        blackwell = blackwell or "GB200" in profile.device or "GB300" in profile.device
        assert ("mxfp8" in profile.peak_tflops) is blackwell, path.stem
        if blackwell:
            assert profile.peak_tflops["mxfp8"] == profile.peak_tflops["fp8"]


def test_mxfp8_exports_as_megatrons_recipe():
    plan = plan_from_document(_llama_on(B200, "mxfp8").to_document())
    text = export_plan(plan, "megatron").text
    assert "--fp8-recipe mxfp8" in text and "--fp8-format e4m3" in text


@pytest.mark.parametrize("scaling", ["mxfp8", "nvfp4"])
def test_a_block_scaled_recipe_changes_on_a_stack_without_it(scaling):
    plan = plan_from_document(_llama_on(B200, scaling).to_document())
    notes = export_plan(plan, "torchtitan").notes
    assert any(f"fp8_scaling {scaling} -> tensorwise" in n for n in notes), notes
    line = _refusal(
        "estimate", "llama3-8b", "--hardware", "dgx-b200", "--gpus", "8", "--dp", "8",
        "--framework", "torchtitan", "--precision", "fp8", "--fp8-scaling", scaling,
    )  # fmt: skip
    assert f"fp8_scaling={scaling}: torchtitan runs the FP8 recipes tensorwise, rowwise" in line


def test_published_mxfp8_rows_run_the_block_scaled_recipe():
    from benchmarks.published_rows import options_of

    rows = []
    for name in ("megatron", "features"):
        doc = json.loads((ROOT / "validation" / "published" / f"{name}.json").read_text())
        rows += [
            r for r in doc["runs"] if "MXFP8" in str((r.get("extras") or {}).get("fp8_recipe"))
        ]
    assert len(rows) == 11  # 7, and Megatron-Bridge 26.02 / 26.02.01 on GB200
    assert all(options_of(r).fp8_scaling == "mxfp8" for r in rows)


def test_sagemaker_export_names_transformer_engines_recipe_for_the_plans_scaling():
    """SMP v2 runs FP8 through TE's fp8_autocast; the note names the TE recipe class of the plan's
    scaling (transformer_engine.common.recipe), or says TE has none (torchao's rowwise)."""
    cases = (
        (_llama_on(B200, "mxfp8"), "MXFP8BlockScaling()"),
        (_llama_on(HW, "delayed"), "DelayedScaling()"),
        (_llama_on(HW, "tensorwise"), "Float8CurrentScaling()"),
    )
    for est, recipe in cases:
        notes = export_plan(plan_from_document(est.to_document()), "sagemaker").notes
        assert any(n.startswith("fp8: ") and recipe in n for n in notes), notes
    rowwise = plan_from_document(_fp8_plan("torchtitan", "rowwise"))
    notes = export_plan(rowwise, "sagemaker").notes
    assert any("fp8_scaling=rowwise, which Transformer Engine has no recipe" in n for n in notes)


def test_a_plan_file_with_mxfp8_on_hopper_is_refused_by_every_command(tmp_path):
    """A hand-edited plan: B200's MXFP8 plan moved to an H100 profile."""
    doc = _llama_on(B200, "mxfp8").to_document()
    doc["hardware"]["name"] = "dgx-h100"
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(doc))
    for args in (["explain", str(path)], ["export", str(path), "--format", "megatron"]):
        line = _refusal(*args)
        assert "fp8_scaling=mxfp8 needs block-scaled FP8 tensor cores" in line, line


def test_recommend_refuses_mxfp8_on_hopper_before_scoring_anything():
    from planner.search import recommend

    def boom(*args, **kwargs):
        raise AssertionError("scored a plan its hardware cannot run")

    with pytest.raises(ConfigError, match="block-scaled"):
        recommend(
            "llama3-8b", "dgx-h100", gpus=8, precision="fp8",
            options=RunOptions(fp8_scaling="mxfp8"), score_fn=boom,
        )  # fmt: skip


def test_a_profile_whose_block_scaled_rate_differs_from_its_fp8_rate_is_refused():
    from hardware_profiles.loader import profile_from_dict

    doc = json.loads((ROOT / "hardware_profiles" / "dgx-b200.json").read_text())
    doc["peak_tflops"]["mxfp8"] = 2 * doc["peak_tflops"]["fp8"]
    with pytest.raises(ConfigError, match="must equal peak_tflops.fp8"):
        profile_from_dict(doc, origin="b200-edited.json")


def test_the_command_line_refuses_that_profile_in_one_line(tmp_path):
    doc = json.loads((ROOT / "hardware_profiles" / "dgx-b200.json").read_text())
    doc["peak_tflops"]["mxfp8"] = 2 * doc["peak_tflops"]["fp8"]
    path = tmp_path / "b200-edited.json"
    path.write_text(json.dumps(doc))
    line = _refusal("estimate", "llama3-8b", "--hardware", str(path), "--gpus", "8", "--dp", "8")
    assert "peak_tflops.mxfp8=9000.0 must equal peak_tflops.fp8 (4500.0)" in line, line
