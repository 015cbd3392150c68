"""Exports without the frameworks: refusals, CLI behaviour, module names, checkpoint conversion.
The frameworks' own parsers check the exports in tests/test_export_validate.py."""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from export_plans import VARIANTS, describe_model, document, plan_for  # noqa: E402

from planner.cli import app  # noqa: E402
from planner.errors import ConfigError  # noqa: E402
from planner.exports import FORMATS, export_plan, megatron_layout, refusals  # noqa: E402
from planner.exports.retarget import retarget  # noqa: E402
from planner.exports.torchtitan import torchtitan_fqns  # noqa: E402
from planner.plan import plan_from_document  # noqa: E402
from planner.run_options import RunOptions

EXAMPLE = Path(__file__).parent / "data" / "plan_example.json"

REFUSED = {  # variant: {format: part of the one-line reason}
    "gpt3-interleaved-uneven": {
        "sagemaker": "pipeline parallelism (pp=10)",
        "fsdp": "pp=10: fsdp allows pp=1 only",
    },
    "gpt3-gpipe-offload": {"sagemaker-v1": "offload=optimizer"},
    "gpt3-zero3-1f1b": {
        "megatron": "zero=3 with pp=10",
        "deepspeed": "zero=3 with pp=10",
        "sagemaker-v1": "ZeRO-3 with pp=10",
    },
    "llama-pp1-zero2-sel": {"sagemaker-v1": "ZeRO-2"},
    "llama-bf16-offload-act": {
        "torchtitan": "offload=activations",
        "megatron": "offload=activations",
    },
    "moe-ep": {
        "torchtitan": "mixture-of-experts",
        "sagemaker-v1": "expert parallelism",
        "fsdp": "pp=4",
    },
    "moe-deepseek-v3": {
        "torchtitan": "multi-token prediction (mtp_modules=1) with pp=4",
        "deepspeed": "sigmoid scoring",
    },
    "gpt3-pp1-zero0-fp16": {
        "torchtitan": "precision=amp-fp16",
        "fsdp": "tp=8: fsdp allows tp=1 only",
    },
    "llama-hsdp-cp-fp8": {
        "deepspeed": "precision=fp8",
        "sagemaker-v1": "context parallelism",
        "fsdp": "tp=8: fsdp allows tp=1 only",
    },
}


@pytest.mark.parametrize("variant,fmt", [(v, f) for v, fmts in REFUSED.items() for f in fmts])
def test_what_the_target_cannot_run_is_refused_in_one_line(variant, fmt):
    with pytest.raises(ConfigError, match="cannot export to " + fmt + ": ") as err:
        export_plan(plan_for(variant), fmt)
    assert REFUSED[variant][fmt] in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_limits_decide_every_refusal(variant):
    """An export succeeds exactly when `refusals` has no reason (the framework rules of
    frameworks/*.json, then what the target's file can express)."""
    plan = plan_for(variant)
    for fmt in FORMATS:
        reasons = refusals(fmt, plan)
        try:
            export_plan(plan, fmt)
            assert reasons == [], (fmt, reasons)
        except ConfigError as err:
            assert reasons and reasons[0] in str(err), (fmt, str(err))


def moe_document(variant, *, plan=None, arch=None, moe=None):
    """A MoE variant's plan document with changes to its plan, model.arch and model.arch.moe."""
    doc = document(variant)
    p = doc["plan"]
    p.update(plan or {})
    p["num_microbatches"] = p["global_batch"] // (p["dp"] * p["micro_batch"])
    doc["model"]["arch"].update(arch or {})
    doc["model"]["arch"]["moe"] = {
        **doc["model"]["arch"]["moe"],
        **(moe or {}),
    }  # VARIANTS' dict stays as it is
    describe_model(doc["model"])  # its description and parameter count follow the edit
    return doc


TORCHTITAN_MOE_REFUSED = {
    # name: (variant, plan, arch, moe changes, part of the one-line reason)
    "mixtral": (
        "moe-qwen3-30b",
        {},
        {"model_type": "mixtral", "qk_norm": False},
        {},
        "(model_type mixtral): torchtitan 0.3.0 builds the MoE families deepseek_v3, qwen3_moe",
    ),
    "qwen3 without QK-norm": ("moe-qwen3-30b", {}, {"qk_norm": False}, {}, "no QK-norm"),
    "qwen3 dense blocks": (
        "moe-qwen3-30b",
        {},
        {},
        {"first_dense_layers": 2},
        "2 dense leading blocks",
    ),
    "qwen3 biases": ("moe-qwen3-30b", {}, {"qkv_bias": True}, {}, "linear biases"),
    "shared-expert gate": (
        "moe-qwen3-30b",
        {},
        {},
        {"shared_experts": 1, "shared_expert_gate": True},
        "a shared-expert gate",
    ),
    "capacity factor": ("moe-qwen3-30b", {}, {}, {"capacity_factor": 1.25}, "dropless"),
    # torchtitan 0.3.0 has no expert tensor-parallel degree (capabilities.expert_tp false): the framework's rules
    # refuse before the exporter's own limits
    "expert_tp with ep": (
        "moe-qwen3-30b",
        {"expert_tp": 2},
        {},
        {},
        "expert_tp=2: torchtitan allows expert_tp=1 only",
    ),
    "expert_tp beyond tp": (
        "moe-qwen3-30b",
        {"ep": 1, "expert_tp": 4},
        {},
        {},
        "expert_tp=4: torchtitan allows expert_tp=1 only",
    ),
    "mtp with cp": (
        "moe-deepseek-v3",
        {"pp": 1, "cp": 2, "dp": 64, "stages": [], "placement": "PDECT"},
        {},
        {},
        "multi-token prediction (mtp_modules=1) with pp=1, cp=2",
    ),
    "deepseek without MLA": (
        "moe-deepseek-v3",
        {},
        {"mla": None, "mtp_modules": 0},
        {},
        "no multi-head latent attention",
    ),
    "mtp outside deepseek": (
        "moe-qwen3-30b",
        {},
        {"mtp_modules": 1},
        {},
        "multi-token prediction (torchtitan's MTP",
    ),
}


@pytest.mark.parametrize("name", sorted(TORCHTITAN_MOE_REFUSED))
def test_torchtitan_refuses_moe_plans_it_cannot_build_in_one_line(name):
    variant, plan, arch, moe, reason = TORCHTITAN_MOE_REFUSED[name]
    with pytest.raises(ConfigError, match="cannot export to torchtitan: ") as err:
        export_plan(
            plan_from_document(moe_document(variant, plan=plan, arch=arch, moe=moe)), "torchtitan"
        )
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_tp_over_the_kv_heads_is_refused_by_the_plan_reader_before_any_exporter():
    """Issue 31: every reader of plans checks the degrees against model.arch (planner.plan.check_against_model),
    so torchtitan's own refusal of this plan is never reached."""
    with pytest.raises(ConfigError) as err:
        plan_from_document(moe_document("moe-qwen3-30b", plan={"tp": 8, "dp": 16, "ep": 8}))
    assert (
        str(err.value) == "tp=8 is invalid: allowed a divisor of heads(32) and kv_heads(4): 1, 2, 4"
    )


def test_torchtitan_moe_job_builds_the_family_with_the_plans_expert_degrees():
    """Qwen3-30B-A3B: torchtitan's Qwen3 MoE builder with the plan's shape, expert_parallel_degree = ep, and the
    DeepSeek-V3 catalog model (MTP, pp = 1): DeepSeek-V3's builder, MTP layers and MTPLoss."""
    text = export_plan(plan_for("moe-qwen3-30b"), "torchtitan").text
    assert (
        "layers = qwen3._build_qwen3_moe_layers(" in text
        and 'qwen3.qwen3_configs["planner"] = _planner_flavor' in text
    )
    assert (
        "moe_hidden_dim=768, num_experts=128, top_k=8," in text
        and "expert_parallel_degree=16," in text
    )
    assert (
        "config.model_spec = qwen3.model_registry('planner', moe_comm_backend='standard')" in text
    )
    compile(text, "planner_job.py", "exec")
    doc = moe_document(
        "moe-deepseek-v3", plan={"pp": 1, "dp": 128, "stages": [], "placement": "PDECT"}
    )
    exported = export_plan(plan_from_document(doc), "torchtitan")
    text = exported.text
    assert (
        "deepseek_v3._build_dsv3_layers(" in text
        and "n_layers=61, n_dense_layers=3, dim=dim, n_heads=128," in text
    )
    assert (
        "router_top_k=8, router_score_func='sigmoid', router_route_norm=True, router_route_scale=2.5,"
        in text
    )
    assert (
        "router_num_expert_groups=8, router_num_limited_groups=4," in text
        and "num_mtp_layers=1" in text
    )
    assert "config.loss = MTPLoss.Config(" in text and "expert_parallel_degree=8," in text
    assert any(note.startswith("mtp_modules=1: torchtitan's MTP layers") for note in exported.notes)
    compile(text, "planner_job.py", "exec")


def test_torchtitan_shard_group_grows_only_where_expert_parallelism_needs_it():
    """torchtitan carves ep from dp_shard x cp x tp: the plan's shard group, else the smallest that holds ep."""
    from planner.exports.torchtitan import torchtitan_dp_shard
    from planner.parallel import ParallelConfig

    def shard(**kw):
        placement = "PDECT" if kw.get("ep", 1) > 1 or kw.get("cp", 1) > 1 else "PDT"
        return torchtitan_dp_shard(
            ParallelConfig(micro_batch=1, global_batch=64, placement=placement, **kw)
        )

    assert shard(dp=8, zero=0) == 1 and shard(dp=8, zero=3, dp_shard=2) == 2
    assert shard(dp=8, zero=0, ep=4) == 4 and shard(dp=8, tp=2, zero=0, ep=4) == 2
    assert shard(dp=8, zero=3, dp_shard=2, ep=8) == 8 and shard(dp=8, zero=3, ep=8) == 8
    assert shard(dp=4, tp=2, cp=2, zero=3, dp_shard=2, ep=8) == 2


def test_a_plan_without_model_shape_is_refused_by_targets_that_build_the_model():
    plan = plan_from_document(json.loads(EXAMPLE.read_text()))
    for fmt in ("torchtitan", "megatron"):
        with pytest.raises(ConfigError, match="model.arch"):
            export_plan(plan, fmt)
    # DeepSpeed needs no model shape, but its PipelineEngine has no interleaved schedule (frameworks/deepspeed.json)
    with pytest.raises(ConfigError, match="schedule=interleaved-1f1b: deepspeed allows 1f1b"):
        export_plan(plan, "deepspeed")
    assert (
        json.loads(export_plan(plan, "sagemaker-v1").text)["smdistributed"]["modelparallel"][
            "parameters"
        ]["microbatches"]
        == 120
    )


def test_torchtitan_last_part_holds_lm_head():
    """torchtitan 0.3 names the output layer lm_head; a part list without it leaves the loss nowhere."""
    parts = torchtitan_fqns([2, 3, 1])
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    assert [sum(n.startswith("layers.") for n in p) for p in parts] == [2, 3, 1]
    text = export_plan(plan_for("llama-zb-uneven"), "torchtitan").text
    assert "'lm_head'" in text and "'output'" not in text and "[parallelism]" not in text


def test_megatron_layout_string():
    assert megatron_layout([4, 5, 3]) == "Et*4|t*5|t*3L"


def test_checkpoint_interval_becomes_steps():
    """Steps at the step time predicted on the target's framework (the plan re-estimated there)."""
    plan = plan_for("llama-hsdp-cp-fp8")
    on_torchtitan = retarget(plan, "torchtitan")[0]
    assert on_torchtitan.prediction.step_time_s != plan.prediction.step_time_s
    steps = max(1, round(1800.0 / on_torchtitan.prediction.step_time_s))
    assert f"config.checkpoint.interval = {steps} " in export_plan(plan, "torchtitan").text
    fsdp = plan_for("fsdp-llama-zero3-ckpt")
    assert (
        f"save_steps={max(1, round(1200.0 / fsdp.prediction.step_time_s))},"
        in export_plan(fsdp, "fsdp").text
    )


def test_gpt_models_export_to_torchtitan_with_their_own_model_and_tied_table():
    text = export_plan(plan_for("gpt3-interleaved-uneven"), "torchtitan").text
    assert (
        "class GPTModel(Decoder)" in text and "tied_model_spec('gpt', 'gpt3-175b', model)" in text
    )
    assert (
        "'tok_embeddings', 'pos_embeddings', 'layers.0'" in text
        and "spmd_backend='partial_dtensor'" in text
    )
    compile(text, "planner_job.py", "exec")
    plan = plan_for("gpt3-interleaved-uneven")
    cp = plan_from_document(
        {
            **plan.document,
            "plan": {
                **plan.document["plan"],
                "cp": 2,
                "dp": 6,
                "placement": "PDCT",
                "num_microbatches": 240,
                "world_size": 960,
            },
        }
    )
    # torchtitan 0.3.0 shards the dataset's positions with the tokens under CP and the GPT model embeds them
    exported = export_plan(cp, "torchtitan").text
    assert (
        "context_parallel_degree=2" in exported.replace(" ", "")
        and "class GPTModel(Decoder)" in exported
    )


def test_fsdp_export_is_one_yaml_document_with_the_trainer_in_comments():
    import yaml

    text = export_plan(plan_for("fsdp-llama-hsdp-zero2"), "fsdp").text
    doc = yaml.safe_load(text)
    assert (
        doc["distributed_type"] == "FSDP"
        and doc["fsdp_config"]["fsdp_reshard_after_forward"] is False
    )
    assert doc["parallelism_config"]["parallelism_config_dp_replicate_size"] == 8
    assert "TrainingArguments(" in text and all(
        line.startswith("#") for line in text.splitlines() if "TrainingArguments" in line
    )
    ddp = yaml.safe_load(export_plan(plan_for("fsdp-llama-ddp"), "fsdp").text)
    assert ddp["distributed_type"] == "MULTI_GPU" and "fsdp_config" not in ddp


def test_sagemaker_v1_uses_the_names_sdk_v2_accepts():
    params = json.loads(export_plan(plan_for("gpt3-1f1b-ends"), "sagemaker-v1").text)[
        "smdistributed"
    ]["modelparallel"]["parameters"]
    assert params["placement_strategy"] == "cluster" and params["default_partition"] == 0
    assert (
        params["auto_partition"] is False
        and params["partitions"] == params["pipeline_parallel_degree"] == 10
    )


runner = CliRunner()


@pytest.fixture
def llama_plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document("llama-1f1b")))
    return path


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron", "deepspeed", "sagemaker-v1"])
def test_cli_export_writes_file(fmt, tmp_path, llama_plan_file):
    out = tmp_path / "cfg"
    result = runner.invoke(
        app, ["export", str(llama_plan_file), "--format", fmt, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.read_text() == export_plan(plan_for("llama-1f1b"), fmt).text


def test_cli_export_stdout_is_the_config(llama_plan_file):
    result = runner.invoke(app, ["export", str(llama_plan_file), "--format", "deepspeed"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["train_batch_size"] == 512


def test_cli_export_refusal_is_one_line_exit_2(tmp_path, llama_plan_file):
    out = tmp_path / "smp.json"
    result = runner.invoke(
        app, ["export", str(llama_plan_file), "--format", "sagemaker", "--out", str(out)]
    )
    assert result.exit_code == 2 and not out.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: cannot export to sagemaker: pipeline parallelism"
    )


@pytest.mark.parametrize(
    "content,needle",
    [('{"schema_version": "7"}', "schema_version"), ("{oops", "JSON"), (None, "readable")],
)
def test_cli_export_rejects_bad_plans_in_one_line(content, needle, tmp_path):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["export", str(path), "--format", "megatron"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error:")


def test_cli_export_unknown_format_exit_2(llama_plan_file):
    result = runner.invoke(app, ["export", str(llama_plan_file), "--format", "jax"])
    assert result.exit_code == 2 and "format" in result.stderr


def test_deepspeed_export_writes_the_partition_that_gives_the_plans_stages_or_refuses():
    """DeepSpeed's PipelineModule splits by partition_method: the JSON's pipeline section names the
    type-balanced
    method and the blocks per stage (the plan's even split); a split DeepSpeed cannot place is
    refused in one line
    (its own partitioner is run on the exports in tests/test_export_matrix.py)."""
    doc = document("llama-1f1b")  # llama3-70b: 80 blocks over pp 4
    text = export_plan(plan_from_document(doc), "deepspeed").text
    pipeline = json.loads(text)["pipeline"]
    assert pipeline["partition_method"] == "type:transformer"
    assert pipeline["blocks_per_stage"] == [20] * 4
    doc["plan"]["stages"] = [21, 19, 20, 20]
    with pytest.raises(ConfigError) as err:
        export_plan(plan_from_document(doc), "deepspeed")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("cannot export to deepspeed: ")
    assert "[20, 20, 20, 20]" in str(err.value)


def test_the_torchtitan_exporter_builds_exactly_the_moe_families_the_framework_profile_names():
    """frameworks/torchtitan.json moe_model_types (what recommend and estimate allow) and the exporter's builders
    (planner.exports.limits.TORCHTITAN_MOE_FAMILIES) name the same families."""
    from frameworks import load_framework
    from planner.exports.limits import TORCHTITAN_MOE_FAMILIES

    assert set(TORCHTITAN_MOE_FAMILIES) == set(
        load_framework("torchtitan").capabilities.moe_model_types
    )


def _estimated_plan(framework, cfg_over, hardware="p5.48xlarge", **options):
    from planner.catalog import get
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    base = dict(
        dp=2,
        tp=4,
        pp=1,
        micro_batch=1,
        global_batch=16,
        seq=4096,
        recompute="selective",
        sequence_parallel=True,
        precision="fp8",
        framework=framework,
    )
    est = estimate(
        get("llama3-8b"),
        hardware,
        ParallelConfig(**{**base, **cfg_over}),
        gpus=8,
        options=RunOptions(**options),
    )
    return plan_from_document(json.loads(json.dumps(est.to_document())))


def test_retarget_keeps_the_run_options_the_target_runs_and_says_which_it_drops():
    """A Megatron plan with Transformer Engine's in-place loss, the FP8 SwiGLU input and recompute_modules,
    exported to torchtitan: the loss is carried (the re-estimate costs it), the two Megatron-Core options
    are dropped with a note each, and the re-estimate is what estimate gives for the same run without them.
    To Megatron itself nothing changes."""
    from planner.catalog import get
    from planner.estimate import estimate

    plan = _estimated_plan(
        "megatron",
        {},
        loss="inplace",
        activation_fp8_input=True,
        recompute_modules=["core_attn", "mlp"],
    )
    moved, notes = retarget(plan, "torchtitan")
    software = moved.document["software"]
    assert software["framework"] == "torchtitan" and software["loss"] == "inplace"
    assert software["activation_fp8_input"] is False and "recompute_modules" not in software
    assert "activation_fp8_input dropped" in notes[0] and "recompute_modules dropped" in notes[0]
    again = estimate(
        get("llama3-8b"), "p5.48xlarge", moved.config, gpus=8, options=RunOptions(loss="inplace")
    )
    assert moved.prediction.step_time_s == pytest.approx(again.step_time_s, rel=1e-12)
    assert retarget(plan, "megatron") == (plan, [])
    # a DeepSpeed BF16_Optimizer plan exported to Megatron: Megatron has no BF16_Optimizer
    ds = _estimated_plan(
        "deepspeed",
        dict(tp=1, dp=8, zero=1, sequence_parallel=False, recompute="full", precision="amp-bf16"),
        bf16_optimizer=True,
    )
    on_megatron, notes = retarget(ds, "megatron")
    assert (
        "bf16_optimizer dropped" in notes[0]
        and on_megatron.document["software"]["bf16_optimizer"] is False
    )


def test_deepspeed_export_says_a_dense_qk_norm_model_is_the_users_code():
    """DeepSpeed's config carries no model: a dense Qwen3 (QK-norm) needs model code that has it, which
    Megatron-DeepSpeed's GPT does not; the note says so as it does for MoE models. A Llama plan gets no such note."""
    qk = [n for n in export_plan(plan_for("fsdp-qwen3-8b"), "deepspeed").notes if "QK-norm" in n]
    assert len(qk) == 1 and "Megatron-DeepSpeed" in qk[0]
    assert not [
        n
        for n in export_plan(plan_for("fsdp-llama-zero3-ckpt"), "deepspeed").notes
        if "QK-norm" in n
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_note_is_in_the_exported_file_not_only_on_stderr(fmt):
    """What the target runs differently from the plan travels with the file: a '# note:' header line, or the
    planner_notes list of a JSON file (issue 30: the pp=1 batch fix was only a stderr note)."""
    checked = 0
    for variant in sorted(VARIANTS):
        try:
            exp = export_plan(plan_for(variant), fmt)
        except ConfigError:
            continue
        if fmt in ("deepspeed", "sagemaker", "sagemaker-v1"):
            in_file = json.loads(exp.text).get("planner_notes", [])
        else:
            in_file = [
                line.removeprefix("# note: ")
                for line in exp.text.splitlines()
                if line.startswith("# note: ")
            ]
        assert in_file == list(exp.notes), variant
        checked += bool(exp.notes)
    assert checked >= 1


def test_retarget_drops_a_module_swap_and_torch_compile_for_another_stack():
    """torch.compile and a swap of the stack's modules belong to the plan's own stack: a
    torchtitan plan with both is re-estimated on fsdp as fsdp runs (its own modules, eager), each
    dropped with a note; the run options reader still carries both on torchtitan itself."""
    from planner.catalog import get
    from planner.estimate import estimate
    from planner.plan import run_options

    over = {"zero": 3, "tp": 1, "dp": 8, "sequence_parallel": False, "recompute": "full"}
    plan = _estimated_plan("torchtitan", over, compile=True, kernels="fused")
    assert run_options(plan.document).chosen().keys() >= {"compile", "kernels"}
    moved, notes = retarget(plan, "fsdp")
    assert "compile dropped" in notes[0] and "kernels dropped" in notes[0]
    plain = estimate(get("llama3-8b"), "p5.48xlarge", moved.config, gpus=8)
    assert moved.document["prediction"]["step_time_s"] == plain.step_time_s
    assert moved.document["software"]["compile"] is False


def test_retarget_says_when_the_target_stack_gathers_fp8_weights_otherwise():
    """Megatron's FP8 recipes hold and gather the GEMM weights in FP8 by default, torchtitan's do
    not (frameworks/*.json fp8_param_gather): the export keeps the target's default and says it;
    a plan that chose it keeps its choice and says nothing."""
    plan = _estimated_plan("megatron", {"zero": 1})
    assert plan.document["software"]["fp8_param_gather"] is True
    moved, notes = retarget(plan, "torchtitan")
    assert moved.document["software"]["fp8_param_gather"] is False
    assert "fp8_param_gather on -> off (torchtitan's default under tensorwise)" in notes[0]
    bf16 = _estimated_plan("megatron", {"zero": 1, "precision": "amp-bf16"})
    assert "fp8_param_gather" not in retarget(bf16, "torchtitan")[1][0]  # nothing gathered in FP8
    # a plan file without model.arch is moved without a re-estimate, and without the note
    document = json.loads(json.dumps(plan.document))
    del document["model"]["arch"]
    notes = retarget(plan_from_document(document), "torchtitan")[1]
    assert "fp8_param_gather" not in notes[0] and "not re-estimated" not in " ".join(notes)


def test_retarget_says_when_a_recipe_change_turns_fp8_weights_on(monkeypatch, tmp_path, request):
    """An NVFP4 plan keeps bf16 weights (Megatron-Bridge's bf16_with_nvfp4_mixed); a target stack
    that runs no NVFP4 but gathers FP8 weights by default (here torchtitan's profile so edited)
    turns them on with its own recipe: the note says so."""
    import frameworks.loader as L

    plan = _estimated_plan(
        "megatron", {"zero": 1}, hardware="p6-b200.48xlarge", fp8_scaling="nvfp4"
    )
    assert plan.document["software"]["fp8_param_gather"] is False
    for path in L.FRAMEWORK_DIR.glob("*.json"):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc["name"] == "torchtitan":
            doc["fp8_param_gather"] = doc["capabilities"]["fp8_param_gather"] = True
            doc["sources"]["fp8_param_gather"] = "a test's stack that gathers FP8 weights"
        (tmp_path / path.name).write_text(json.dumps(doc), encoding="utf-8")
    monkeypatch.setattr(L, "FRAMEWORK_DIR", tmp_path)
    L.load_framework.cache_clear()  # profiles are cached by name
    request.addfinalizer(L.load_framework.cache_clear)
    notes = retarget(plan, "torchtitan")[1]
    assert "fp8_scaling nvfp4 -> " in notes[0]
    assert "fp8_param_gather off -> on (torchtitan's default under " in notes[0]
