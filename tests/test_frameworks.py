"""Framework profiles (frameworks/*.json): every shipped file loads, every value is sourced, a bad file is
one line naming the key, and the capabilities decide what estimate accepts (frameworks.rules, the one
rule set that search, estimate and export share)."""

from __future__ import annotations

import copy
import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from frameworks import (
    ATTENTION_KERNELS,
    KERNELS,
    LOSS_KERNELS,
    available_frameworks,
    load_framework,
)
from frameworks.loader import framework_from_dict
from frameworks.profile import Capabilities, capability_reference
from frameworks.rules import violations
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.parallel import FRAMEWORKS, ParallelConfig
from planner.run_options import RunOptions

DIR = Path(__file__).resolve().parents[1] / "frameworks"
NAMES = FRAMEWORKS


def _doc(name):
    return json.loads((DIR / f"{name}.json").read_text())


def test_the_four_stacks_ship_and_load():
    assert set(NAMES) <= set(available_frameworks())
    for name in NAMES:
        fw = load_framework(name)
        assert fw.name == name and fw.kernels in KERNELS and fw.attention in ATTENTION_KERNELS
        assert fw.loss in LOSS_KERNELS
        for precision in fw.capabilities.precisions:  # every precision it runs has its state bytes
            assert precision in fw.state_bytes


@pytest.mark.parametrize(
    "mutate,key",
    [
        (lambda d: d.update(unknown_knob=1), "unknown_knob"),
        (lambda d: d.pop("loss"), "loss"),
        (lambda d: d.update(loss="chunked"), "loss"),
        (lambda d: d.update(attention="xformers"), "attention"),
        (lambda d: d["sources"].pop("loss"), "sources.loss"),
        (lambda d: d.update(allocator_overhead_fraction=1.5), "allocator_overhead_fraction"),
        (lambda d: d["state_bytes"]["amp-bf16"].update(grad=-1), "state_bytes.amp-bf16.grad"),
        (
            lambda d: d["capabilities"].update(activation_offload="sometimes"),
            "capabilities.activation_offload",
        ),
        (
            lambda d: d["capabilities"].update(max_virtual_stages=0),
            "capabilities.max_virtual_stages",
        ),
        (lambda d: d["capabilities"].pop("zero"), "capabilities.zero"),
        (
            lambda d: d["capabilities"].update(optimizer_offload_min_zero=4),
            "capabilities.optimizer_offload_min_zero",
        ),
        (
            lambda d: d["capabilities"].update(recompute_modules="yes"),
            "capabilities.recompute_modules",
        ),
        (
            lambda d: d["capabilities"].update(moe_model_types="mixtral"),
            "capabilities.moe_model_types",
        ),
        (lambda d: d["capabilities"].update(moe_model_types=[""]), "capabilities.moe_model_types"),
        (lambda d: d["capabilities"].update(schedules=["1f1b", "2f2b"]), "capabilities.schedules"),
        (lambda d: d["capabilities"].update(zero=[0, 1.5]), "capabilities.zero"),
        (lambda d: d["capabilities"].update(placements=["DPX"]), "capabilities.placements"),
        (
            lambda d: d["capabilities"].update(moe_dispatchers=["deepep"]),
            "capabilities.moe_dispatchers",
        ),
        (lambda d: d["capabilities"].update(tp=1), "capabilities.tp"),
        (lambda d: d.update(grad_bucket_params=[40e6]), "grad_bucket_params"),
        (lambda d: d.update(grad_bucket_params=[40e6, -1]), "grad_bucket_params"),
        (lambda d: d.update(grad_bucket_params=[1e-12, 1e-12]), "grad_bucket_params"),
        (lambda d: d.update(grad_bucket_params=["40M", 1e6]), "grad_bucket_params"),
        (
            lambda d: d["capabilities"].update(sequence_parallel="sometimes"),
            "capabilities.sequence_parallel",
        ),
    ],
)
def test_a_bad_profile_is_one_line_naming_the_key(mutate, key):
    doc = copy.deepcopy(_doc("megatron"))
    mutate(doc)
    with pytest.raises(ConfigError) as err:
        framework_from_dict(doc, origin="megatron.json")
    message = str(err.value)
    assert key in message and "\n" not in message


def test_a_capability_left_out_takes_its_declared_default():
    """Capabilities with a default are optional (frameworks.profile.capability): a profile without
    them loads with the declared value; one without a required key is one line naming it."""
    doc = copy.deepcopy(_doc("megatron"))
    for key in ("tp_comm_overlap", "moe_dispatchers", "uneven_stages", "moe_model_types"):
        doc["capabilities"].pop(key)
    caps = framework_from_dict(doc, origin="megatron.json").capabilities
    assert caps.tp_comm_overlap is False and caps.moe_dispatchers == ("alltoall",)
    assert caps.uneven_stages is True and caps.moe_model_types is None
    assert caps.precisions == tuple(_doc("megatron")["capabilities"]["precisions"])
    doc["capabilities"].pop("precisions")
    with pytest.raises(ConfigError, match="missing required key 'capabilities.precisions'"):
        framework_from_dict(doc, origin="megatron.json")


def test_the_capability_reference_in_the_docs_is_the_declarations():
    """docs/framework-profiles.md's table is rendered from the declarations the loader validates."""
    text = (DIR.parent / "docs" / "framework-profiles.md").read_text()
    table = text.split("<!-- capabilities -->\n")[1].split("\n<!-- /capabilities -->")[0]
    assert table == capability_reference(), "re-render the table: see docs/framework-profiles.md"
    for declared in fields(Capabilities):
        assert f"| `{declared.name}` |" in table


def test_every_cost_value_has_a_source():
    for name in NAMES:
        doc = _doc(name)
        for key in (
            "kernels",
            "attention",
            "loss",
            "state_bytes",
            "capabilities",
            "allocator_overhead_fraction",
        ):
            assert doc["sources"].get(key, "").strip(), (name, key)


def _cfg(**kw):
    base = dict(dp=8, tp=1, pp=1, micro_batch=1, global_batch=64, seq=2048, framework="megatron")
    return ParallelConfig(**{**base, **kw})


def test_megatron_offloads_activations_only_without_pipelining_or_recompute():
    fw = load_framework("megatron")
    assert violations(fw, _cfg(offload="activations")) == []
    bad = violations(fw, _cfg(offload="activations", recompute="full"))
    assert len(bad) == 1 and "offload=activations" in bad[0] and "recompute=none" in bad[0]
    deepspeed = _cfg(offload="activations", recompute="full", zero=1, framework="deepspeed")
    assert (
        violations(load_framework("deepspeed"), deepspeed) == []
    )  # cpu_checkpointing offloads checkpoints


def test_estimate_refuses_what_the_framework_cannot_run_in_one_line():
    cfg = _cfg(dp=2, tp=1, pp=4, zero=3, global_batch=64, framework="deepspeed")
    with pytest.raises(ConfigError) as err:
        estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8)
    assert "zero=3 with pp=4" in str(err.value) and "\n" not in str(err.value)


def test_deepspeed_ulysses_with_megatron_sequence_parallelism_is_refused_and_never_searched():
    """Megatron-DeepSpeed refuses --ds-sequence-parallel-size with --sequence-parallel
    (capabilities.cp_with_sequence_parallel false): estimate says so in one line, the search never tries it."""
    from planner.candidates import SearchSpace
    from typer.testing import CliRunner
    from planner.cli import app

    args = [
        "estimate",
        "llama3-8b",
        "--hardware",
        "p5.48xlarge",
        "--gpus",
        "16",
        "--dp",
        "2",
        "--tp",
        "4",
        "--cp",
        "2",
        "--cp-comm",
        "a2a",
        "--framework",
        "deepspeed",
        "--global-batch",
        "16",
        "--seq",
        "8192",
    ]
    bad = CliRunner().invoke(app, [*args, "--sequence-parallel"])
    assert bad.exit_code == 2 and "cp=2 with sequence_parallel=true" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    assert CliRunner().invoke(app, args).exit_code == 0
    space = SearchSpace().for_framework(load_framework("deepspeed"))
    assert not space.cp_with_sequence_parallel
    assert SearchSpace().for_framework(load_framework("megatron")).cp_with_sequence_parallel


def test_the_loss_kernel_changes_the_last_stage_memory_not_the_time_much():
    cfg = _cfg(dp=8, micro_batch=4, global_batch=32, framework="fsdp", zero=3, precision="amp-bf16")
    upcast = estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8)
    fused = estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8, options=RunOptions(loss="fused"))
    assert upcast.software.loss == "upcast" and fused.software.loss == "fused"
    # 4 x 2048 tokens x 128256 vocab: upcast keeps 12 bytes per logit at its peak, the fused kernel 4
    assert upcast.peak_bytes_per_gpu - fused.peak_bytes_per_gpu == pytest.approx(
        8 * 4 * 2048 * 128256, rel=0.01
    )
    assert fused.step_time_s <= upcast.step_time_s
    with pytest.raises(ConfigError):
        estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8, options=RunOptions(loss="chunked"))


def test_cross_entropy_on_16bit_logits_keeps_no_fp32_copy():
    """loss "native" (torch's cross_entropy on bf16 logits, AutoModel's MaskedCrossEntropy(fp32_upcast=False)):
    the logits the loop holds, the bf16 log-softmax, its gradient and the input gradient, 4 x 2 bytes per logit
    at the peak where the upcast keeps 12; and it streams fewer bytes, so it is never slower."""
    cfg = _cfg(
        dp=8, micro_batch=4, global_batch=32, framework="torchtitan", zero=3, precision="amp-bf16"
    )
    upcast = estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8)
    native = estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8, options=RunOptions(loss="native"))
    assert upcast.software.loss == "upcast" and native.software.loss == "native"
    assert upcast.peak_bytes_per_gpu - native.peak_bytes_per_gpu == pytest.approx(
        4 * 4 * 2048 * 128256, rel=0.01
    )
    assert native.step_time_s < upcast.step_time_s


def test_transformer_engine_cross_entropy_keeps_only_the_16bit_logits_it_overwrites():
    """loss "inplace" (TE's parallel_cross_entropy, Megatron-Bridge's cross_entropy_fusion_impl "te"): the gradient
    is written over the 16-bit logits in the forward, so c V per token at both moments, where Megatron's
    vocab-parallel cross-entropy keeps (c + 4) V; and it streams fewer bytes, so it is never slower."""
    cfg = _cfg(dp=8, micro_batch=2, global_batch=64, seq=8192, precision="amp-bf16")
    vocab = estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8)
    inplace = estimate("llama3-8b", "p5.48xlarge", cfg, gpus=8, options=RunOptions(loss="inplace"))
    assert vocab.software.loss == "vocab_parallel" and inplace.software.loss == "inplace"
    assert vocab.peak_bytes_per_gpu - inplace.peak_bytes_per_gpu == pytest.approx(
        4 * 2 * 8192 * 128256, rel=0.01
    )
    assert inplace.step_time_s < vocab.step_time_s
    # recommend searches with it, every plan document says so, and explain's fresh search keeps it
    from planner.explain import _software_options
    from planner.search import recommend

    rec = recommend("llama3-8b", "p5.48xlarge", gpus=8, top=2, options=RunOptions(loss="inplace"))
    assert all(d["software"]["loss"] == "inplace" for d in (rec.best, *rec.alternatives))
    assert _software_options(rec.best).loss == "inplace"
    # Megatron-Bridge's published rows name it, and its two GB200 Llama 3 70B runs (40 of 80 layers offloaded) fit
    from benchmarks import published_rows as R
    from benchmarks.stack_predictions import predict

    gb200 = [
        c
        for c in R.load(("megatron", "features"))
        if c.id in ("mb25.09-llama3-70b-gb200-64gpu-fp8cs", "mb2511-gb200-llama3-70b-fsdp")
    ]
    assert len(gb200) == 2 and all(c.options.loss == "inplace" and predict(c).fits for c in gb200)


def test_selective_recompute_under_fp8_drops_the_attention_output_the_projection_no_longer_holds():
    """Megatron-Core's selective recomputation checkpoints the core attention: with a flash kernel it keeps Q, K, V
    and drops the log-sum-exp and, under FP8, the 16-bit output (the projection saves its FP8 copy); in 16 bits the
    projection's saved input is that output, so only the log-sum-exp goes."""
    from cost_models import blocks as B
    from planner.catalog import get

    spec = get("llama3-70b")
    for precision, dropped in (
        ("fp8", 4.0 * spec.heads + 2.0 * spec.attn_width),
        ("amp-bf16", 4.0 * spec.heads),
    ):
        table = B.block_table(spec, precision, "fused", flash=True)
        assert table.scores_saved.shard == pytest.approx(dropped) and table.scores_saved.rep == 0.0
    cfg = _cfg(
        dp=1,
        tp=8,
        pp=1,
        micro_batch=1,
        global_batch=8,
        seq=8192,
        precision="fp8",
        sequence_parallel=True,
    )
    none = estimate("llama3-70b", "p5.48xlarge", cfg, gpus=8)
    selective = estimate("llama3-70b", "p5.48xlarge", replace(cfg, recompute="selective"), gpus=8)
    assert selective.memory()["activations_bytes"] < none.memory()["activations_bytes"]
    assert selective.step_time_s > none.step_time_s


def test_swiglu_input_kept_in_fp8_saves_one_byte_per_element_of_both_fc1_halves():
    """activation_fp8_input (Megatron-Core's activation_func_fp8_input_store): the fused SwiGLU keeps its 2 f-wide
    input as float8_e4m3fn, so each block of each micro-batch in flight holds 2 f (c - 1) bytes per token less;
    megatron only, SwiGLU only, each refused in one line elsewhere."""
    from planner.catalog import get

    spec = get("llama3-8b")
    cfg = _cfg(dp=8, micro_batch=1, global_batch=64, seq=4096, precision="fp8")
    bf16_in = estimate(spec, "p5.48xlarge", cfg, gpus=8)
    fp8_in = estimate(
        spec, "p5.48xlarge", cfg, gpus=8, options=RunOptions(activation_fp8_input=True)
    )
    saved = bf16_in.memory()["activations_bytes"] - fp8_in.memory()["activations_bytes"]
    assert saved == pytest.approx(spec.layers * 4096 * 2 * spec.d_ffn * (2 - 1), rel=1e-9)
    assert fp8_in.step_time_s >= bf16_in.step_time_s  # the FP8 copy is one more write
    assert fp8_in.to_document()["software"]["activation_fp8_input"] is True
    with pytest.raises(ConfigError, match="SwiGLU"):
        estimate(
            "gpt3-175b",
            "p5.48xlarge",
            replace(cfg, seq=2048),
            gpus=8,
            options=RunOptions(activation_fp8_input=True),
        )
    with pytest.raises(ConfigError, match="fsdp cannot run this plan: activation_fp8_input"):
        estimate(
            spec,
            "p5.48xlarge",
            replace(cfg, framework="fsdp"),
            gpus=8,
            options=RunOptions(activation_fp8_input=True),
        )
    # DeepSeek-V3's pre-training run caches its MoE SwiGLU inputs in FP8 (report Sec. 3.3.3): with it, it fits
    from benchmarks import published_rows as R
    from benchmarks.stack_predictions import predict

    dsv3 = next(c for c in R.load(("moe",)) if c.id == "deepseek-v3-pretrain-h800-2048")
    assert dsv3.row["trained"] and dsv3.options.activation_fp8_input is True and predict(dsv3).fits


def test_automodel_qwen3_moe_run_fits_because_its_loss_is_not_upcast():
    """NeMo AutoModel's Qwen3-30B-A3B benchmark (8 H100, FSDP2, ep 8, micro-batch 4 x 4096, vocab 151936) trained
    with MaskedCrossEntropy(fp32_upcast=False); costed with torchtitan's upcast loss it needed 1.12 x the device."""
    from benchmarks import published_rows as R
    from benchmarks.stack_predictions import predict

    case = next(c for c in R.load(("moe",)) if c.id == "automodel-qwen3-30b-h100-8")
    assert case.row["trained"] and case.options.loss == "native"
    assert predict(case).fits is True
    upcast = case.options.with_(loss="upcast")
    est = estimate(case.spec, case.hardware, case.config, gpus=case.row["gpus"], options=upcast)
    assert not est.fits


def test_swapping_in_fused_modules_drops_the_stacks_own_compute_efficiency():
    """compute_efficiency is fitted on a stack's runs with its own modules; a run with Transformer Engine's fused
    modules (NeMo AutoModel on FSDP2) runs at the kernel model's rate, as Megatron-Core does."""
    from planner.software import software_for

    titan = software_for("torchtitan")
    assert titan.framework.compute_efficiency < 1.0
    fused = software_for("torchtitan", options=RunOptions(kernels="fused"))
    assert fused.framework.kernels == "fused" and fused.framework.compute_efficiency == 1.0
    assert (
        software_for("torchtitan", options=RunOptions(kernels="torch")).framework.compute_efficiency
        == titan.framework.compute_efficiency
    )


def test_deepspeed_pipeline_sends_are_partitioned_over_tensor_parallelism_like_megatron():
    """DeepSpeed's PipelineEngine partitions a stage's output over the tensor-parallel group before the send and
    all-gathers it on the receiver (PartitionedTensor, pipe_partitioned default true), as Megatron's scatter/gather
    does: the same plan pays the same pipeline p2p on both stacks, and tp times less than whole activations."""
    import dataclasses

    cfg = dict(
        dp=2, tp=8, pp=4, micro_batch=1, global_batch=64, seq=2048, zero=1, precision="amp-bf16"
    )
    times = {
        fw: estimate(
            "gpt3-175b",
            "dgx-a100-80g",
            _cfg(**cfg, framework=fw, placement="PDT"),
            gpus=64,
        ).time_breakdown_s()["pp_p2p"]
        for fw in ("megatron", "deepspeed")
    }
    assert (
        times["deepspeed"] == pytest.approx(times["megatron"], rel=1e-9) and times["deepspeed"] > 0
    )
    whole = dataclasses.replace(load_framework("deepspeed"), pp_scatter_gather=False)
    sent_whole = estimate(
        "gpt3-175b",
        "dgx-a100-80g",
        _cfg(**cfg, framework="deepspeed", placement="PDT"),
        gpus=64,
        framework_profile=whole,
    ).time_breakdown_s()["pp_p2p"]
    # the stage neighbours sit on other nodes (placement PDT): whole activations put tp x the bytes on the NICs
    assert sent_whole > 4 * times["deepspeed"]


@pytest.mark.parametrize("framework", ["deepspeed", "fsdp"])
def test_optimizer_offload_without_zero_is_refused_and_never_recommended(framework):
    """DeepSpeed offloads the optimizer only as a ZeRO feature and FSDP's CPU offload needs a sharded model
    (capabilities.optimizer_offload_min_zero): estimate refuses ZeRO-0 with offload in one line, and the search,
    which once proposed dp=1 ZeRO-0 with offload for GPT-3 on 16 A100s under DeepSpeed (its own export refused
    it), offers none; every plan it offers exports to the framework."""
    from planner.exports import export_plan
    from planner.plan import plan_from_document
    from planner.search import recommend

    tp, pp = (4, 4) if framework == "deepspeed" else (1, 1)
    cfg = ParallelConfig(
        dp=16 // (tp * pp),
        tp=tp,
        pp=pp,
        micro_batch=1,
        global_batch=512,
        zero=0,
        offload="optimizer",
        framework=framework,
        precision="amp-bf16",
        sequence_parallel=tp > 1,
        placement="PDT" if framework == "deepspeed" else "DPT",
    )
    with pytest.raises(ConfigError, match="offload=optimizer with ZeRO-0") as err:
        estimate(
            "gpt3-175b" if framework == "deepspeed" else "gpt3-6.7b", "p4de.24xlarge", cfg, gpus=16
        )
    assert "\n" not in str(err.value)
    model = "gpt3-175b" if framework == "deepspeed" else "gpt3-6.7b"
    rec = recommend(model, "p4de.24xlarge", gpus=16, global_batch=512, framework=framework, top=5)
    docs = [rec.best, *rec.alternatives]
    assert any("optimizer" in d["plan"]["offload"] for d in docs) or framework == "fsdp"
    for doc in docs:
        assert not ("optimizer" in doc["plan"]["offload"] and doc["plan"]["zero"] == 0), doc["plan"]
        export_plan(plan_from_document(dict(doc)), framework)


def _bf16_run(**over):
    base = dict(
        dp=8,
        tp=4,
        pp=12,
        micro_batch=2,
        global_batch=2048,
        zero=1,
        recompute="full",
        precision="amp-bf16",
        framework="deepspeed",
        sequence_parallel=False,
        placement="PDT",
        seq=2048,
    )
    return ParallelConfig(**{**base, **over})


def test_bf16_optimizer_costs_its_fp32_accumulation_its_extra_gather_and_its_per_micro_batch_update():
    """DeepSpeed's BF16_Optimizer (BLOOM-176B's): gradients kept as bf16 plus an unsharded fp32 accumulation
    buffer (6 bytes per parameter instead of 2), one all-gather of the updated parameters after the step on
    top of the all-reduce, and an fp32 accumulation of every gradient after each micro-batch through an fp32
    temporary (18 bytes per parameter streamed)."""
    from cost_models.compute import memory_Bps
    from planner.software import software_for

    sw = software_for("deepspeed", options=RunOptions(bf16_optimizer=True))
    s, plain = sw.state_bytes("amp-bf16"), software_for("deepspeed").state_bytes("amp-bf16")
    assert (s.grad, s.reduce) == (6.0, 2.0) and (plain.grad, plain.reduce) == (2.0, 2.0)
    spec = "gpt3-175b"
    zero1 = estimate(spec, "dgx-a100-80g", _bf16_run(), gpus=384)
    bf16 = estimate(
        spec, "dgx-a100-80g", _bf16_run(), gpus=384, options=RunOptions(bf16_optimizer=True)
    )
    assert bf16.to_document()["software"]["bf16_optimizer"] is True
    params_rank = float(zero1.scores.params_bytes[0]) / 2.0  # bf16 parameters of the peak rank
    grads_gap = float(bf16.scores.grads_bytes[0]) - float(zero1.scores.grads_bytes[0])
    assert grads_gap == pytest.approx(4.0 * params_rank, rel=1e-9)
    m = 2048 // (8 * 2)
    step_gap = float(bf16.scores.optimizer[0]) - float(zero1.scores.optimizer[0])
    assert step_gap == pytest.approx(m * params_rank * 18.0 / memory_Bps(zero1.hardware), rel=0.02)
    assert float(bf16.scores.dp_comm[0]) > float(zero1.scores.dp_comm[0])
    assert (
        bf16.step_time_s > zero1.step_time_s and bf16.peak_bytes_per_gpu > zero1.peak_bytes_per_gpu
    )


@pytest.mark.parametrize(
    "framework,over,match",
    [
        ("fsdp", {}, "fsdp has no BF16_Optimizer"),
        ("deepspeed", {"precision": "amp-fp16"}, "bf16_optimizer needs bf16 training"),
        (
            "deepspeed",
            {"zero": 2, "pp": 1, "dp": 96, "global_batch": 1536},
            "bf16_optimizer shards only the optimizer states, as ZeRO-1",
        ),
    ],
)
def test_bf16_optimizer_errors_are_one_line(framework, over, match):
    cfg = (
        _bf16_run(framework=framework, **over)
        if framework == "deepspeed"
        else ParallelConfig(
            dp=384, micro_batch=1, global_batch=384, zero=3, precision="amp-bf16", framework="fsdp"
        )
    )
    with pytest.raises(ConfigError, match=match) as err:
        estimate(
            "gpt3-175b", "dgx-a100-80g", cfg, gpus=384, options=RunOptions(bf16_optimizer=True)
        )
    assert "\n" not in str(err.value)


def test_bigscience_run_that_ran_out_of_memory_with_bf16_optimizer_is_predicted_to():
    """BigScience's 2022-02-28 prequel run dp16 tp4 pp6 (micro-batch 2) ran out of memory under BF16_Optimizer;
    costed as ZeRO-1 it was predicted to fit (its fp32 gradient buffer, 4 bytes per parameter, was missing)."""
    from benchmarks import published_rows as R
    from benchmarks.stack_predictions import predict

    case = next(
        c
        for c in R.load(("deepspeed",))
        if c.id == "bloomprq-02-28-h12288-l100-a64-dp16-tp4-pp6-mb2-gbs2048"
    )
    assert not case.row.get("trained", True) and case.options.bf16_optimizer is True
    assert predict(case).fits is False
    without = case.options.with_(bf16_optimizer=False)
    est = estimate(case.spec, case.hardware, case.config, gpus=case.row["gpus"], options=without)
    assert est.fits


def test_estimate_cli_takes_the_bf16_optimizer_and_the_stacks_own_rank_order():
    """`planner estimate --framework deepspeed` without --placement gets DeepSpeed's PDT (it used to get DPT and be
    refused), and --bf16-optimizer is costed and said; on a stack without it, one line and exit 2."""
    from typer.testing import CliRunner
    from planner.cli import app

    args = [
        "estimate",
        "gpt3-175b",
        "--hardware",
        "dgx-a100-80g",
        "--gpus",
        "384",
        "--dp",
        "8",
        "--tp",
        "4",
        "--pp",
        "12",
        "--zero",
        "1",
        "--micro-batch",
        "2",
        "--global-batch",
        "2048",
        "--recompute",
        "full",
        "--precision",
        "amp-bf16",
    ]
    runner = CliRunner()
    out = runner.invoke(app, [*args, "--framework", "deepspeed", "--bf16-optimizer", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["plan"]["placement"] == "PDT" and doc["software"]["bf16_optimizer"] is True
    assert (
        "DeepSpeed BF16_Optimizer"
        in runner.invoke(app, [*args, "--framework", "deepspeed", "--bf16-optimizer"]).stdout
    )
    bad = runner.invoke(app, [*args, "--framework", "megatron", "--bf16-optimizer"])
    assert (
        bad.exit_code == 2
        and "megatron has no BF16_Optimizer" in bad.output
        and bad.output.count("\n") == 1
    )


def test_recommend_with_the_bf16_optimizer_searches_what_it_runs_and_explain_keeps_it():
    """recommend(bf16_optimizer=True) offers ZeRO-1 plans without optimizer offload only (what BF16_Optimizer
    runs), each costed with it and exported as DeepSpeed runs it; explain's fresh search keeps the option."""
    from planner.explain import research
    from planner.exports import export_plan
    from planner.plan import plan_from_document
    from planner.search import recommend

    rec = recommend(
        "gpt3-175b",
        "dgx-a100-80g",
        gpus=384,
        global_batch=2048,
        framework="deepspeed",
        top=3,
        options=RunOptions(bf16_optimizer=True),
    )
    for doc in [rec.best, *rec.alternatives]:
        assert doc["plan"]["zero"] == 1 and "optimizer" not in doc["plan"]["offload"]
        assert doc["software"]["bf16_optimizer"] is True
        assert json.loads(export_plan(plan_from_document(dict(doc)), "deepspeed").text)[
            "data_types"
        ] == {"grad_accum_dtype": "fp32"}
    fresh = research(rec.best, top=2)
    assert all(a["plan"]["zero"] == 1 for a in fresh["alternatives"])


def test_torchtitan_builds_only_its_own_moe_families():
    """torchtitan 0.3.0 ships DeepSeek-V3, Qwen3 MoE and gpt-oss (capabilities.moe_model_types): estimate and
    recommend refuse Mixtral on it in one line (recommend used to offer plans its export then refused), Megatron
    builds it."""
    from planner.search import recommend

    cfg = ParallelConfig(
        dp=32,
        ep=8,
        micro_batch=1,
        global_batch=64,
        zero=3,
        framework="torchtitan",
        placement="DPET",
        seq=4096,
    )
    for run in (
        lambda: estimate("mixtral-8x7b", "p5.48xlarge", cfg, gpus=32),
        lambda: recommend("mixtral-8x7b", "p5.48xlarge", gpus=32, framework="torchtitan"),
    ):
        with pytest.raises(
            ConfigError, match="mixture-of-experts model_type=mixtral: torchtitan builds"
        ) as err:
            run()
        assert "\n" not in str(err.value)
    assert recommend("mixtral-8x7b", "p5.48xlarge", gpus=32, top=1).best["plan"]["ep"] >= 1
    assert (
        recommend("qwen3-30b-a3b", "p5.48xlarge", gpus=16, framework="torchtitan", top=1).best[
            "plan"
        ]["ep"]
        >= 1
    )


def test_torchtitan_runs_multi_token_prediction_without_pipeline_or_context_parallelism():
    """torchtitan 0.3.0's MTPDecoder refuses pp > 1 and cp > 1 (capabilities.mtp_with_pp_or_cp): estimate refuses
    such a DeepSeek-V3 plan in one line, recommend searches pp = cp = 1 only (it used to offer pp > 1 plans the
    export refused), --cp 2 is refused up front; Megatron runs MTP with a pipeline."""
    from dataclasses import replace

    from planner.candidates import SearchSpace
    from planner.catalog import get as get_model
    from planner.search import recommend

    assert load_framework("torchtitan").capabilities.mtp_with_pp_or_cp is False
    assert load_framework("megatron").capabilities.mtp_with_pp_or_cp is True
    cfg = ParallelConfig(
        dp=32,
        pp=8,
        ep=8,
        micro_batch=1,
        global_batch=512,
        zero=2,
        framework="torchtitan",
        placement="PDET",
    )
    with pytest.raises(
        ConfigError,
        match="multi-token-prediction module.* with pp=8, cp=1: torchtitan runs them with "
        "pp=1 and cp=1 only",
    ) as err:
        estimate("deepseek-v3", "p5.48xlarge", cfg, gpus=256)
    assert "\n" not in str(err.value)
    plans = recommend("deepseek-v3", "p5.48xlarge", gpus=256, framework="torchtitan", top=5)
    assert all(
        d["plan"]["pp"] == 1 and d["plan"]["cp"] == 1 for d in (plans.best, *plans.alternatives)
    )
    # ... and says so, with what lifts it, in its search summary and in the plan's search block
    held = plans.stats.held
    assert set(held) == {"pp", "cp"} and "num_nextn_predict_layers" in held["pp"]
    assert plans.best["search"]["held"] == held and plans.to_document()["search"]["held"] == held
    # (the two searches below hold ep = 8, tp = 1, cp = 1: the pipeline is what they show)
    narrow = SearchSpace(ep=(8,), max_tp=1, cp=(1,))
    megatron = recommend(
        "deepseek-v3", "p5.48xlarge", gpus=256, framework="megatron", top=1, space=narrow
    )
    assert not megatron.stats.held and megatron.best["plan"]["pp"] > 1
    with pytest.raises(ConfigError, match="multi-token-prediction"):
        recommend(
            "deepseek-v3",
            "p5.48xlarge",
            gpus=256,
            framework="torchtitan",
            space=SearchSpace(cp=(2,)),
        )
    # without its MTP module the same model pipelines on torchtitan
    no_mtp = replace(get_model("deepseek-v3"), mtp_modules=0)
    assert any(
        d["plan"]["pp"] > 1
        for d in recommend(
            no_mtp, "p5.48xlarge", gpus=256, framework="torchtitan", top=20, space=narrow
        ).alternatives
    )


def test_torchtitan_shards_the_experts_over_tp_without_expert_parallelism(monkeypatch):
    """torchtitan 0.3.0 puts routed experts on the dense TP axis when ep = 1 (moe_sharding.py
    expert_param_placement_dense): its plan costs what Megatron's expert_tp = tp does, not replicated experts
    (expert memory, the all-gather dispatcher); with ep > 1 it shards them over ep only. A tp that does not divide
    the expert width is refused in one line."""
    import dataclasses

    from planner.catalog import get

    spec = get("qwen3-30b-a3b")
    base = dict(
        dp=4,
        tp=2,
        micro_batch=1,
        global_batch=8,
        zero=2,
        seq=4096,
        recompute="full",
        placement="DPT",
        sequence_parallel=True,
    )
    tt = estimate(spec, "p5.48xlarge", ParallelConfig(framework="torchtitan", **base), gpus=8)
    real = load_framework("torchtitan")
    replicated = estimate(
        spec,
        "p5.48xlarge",
        ParallelConfig(framework="torchtitan", **base),
        gpus=8,
        framework_profile=dataclasses.replace(real, experts_follow_tp_without_ep=False),
    )
    ep = lambda e: e.to_document()["prediction"]["expert_parallel"]  # noqa: E731
    assert ep(tt)["expert_tp"] == 2 and ep(replicated)["expert_tp"] == 1
    # ZeRO-2 keeps every parameter a rank holds (4 bytes each, fp32 under FSDP2's mixed precision): the half of the
    # routed experts that the other tp rank holds is what the sharded plan saves
    routed = spec.layers * spec.moe.experts * 3 * spec.hidden * spec.moe.expert_ffn
    saved = float(replicated.scores.params_bytes[0]) - float(tt.scores.params_bytes[0])
    assert saved == pytest.approx(routed / 2 * 4, rel=0.02)
    monkeypatch.undo()
    odd = dataclasses.replace(spec, name="odd", moe=dataclasses.replace(spec.moe, expert_ffn=771))
    with pytest.raises(ConfigError, match="expert_ffn=771 does not divide by 2") as err:
        estimate(odd, "p5.48xlarge", ParallelConfig(framework="torchtitan", **base), gpus=8)
    assert "\n" not in str(err.value)


def test_a_shipped_file_named_after_another_stack_is_one_line(tmp_path, monkeypatch):
    """The stack list is the folder's file names (planner.parallel.FRAMEWORKS): a file whose name
    is not its stack's would list a stack that loads as another."""
    import frameworks.loader as loader

    (tmp_path / "nemo.json").write_text((DIR / "megatron.json").read_text())
    monkeypatch.setattr(loader, "FRAMEWORK_DIR", tmp_path)  # (a name no other test loaded: cached)
    with pytest.raises(ConfigError) as err:
        load_framework("nemo")
    assert "\n" not in str(err.value) and "'nemo', the file's name" in str(err.value)
