"""Exports round-trip: parse each output back and compare degrees and batch sizes with the plan."""
import argparse
import json
import shlex
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError
from planner.exports import FORMATS, export_plan
from planner.partition import even_split
from planner.plan import plan_from_document

EXAMPLE = Path(__file__).parent / "data" / "plan_example.json"

VARIANTS = {
    "uneven-interleaved": {},
    "even-1f1b-zero3": dict(dp=12, tp=8, pp=10, schedule="1f1b", virtual_stages=1, zero=3,
                            stages=[10, 10, 10, 10, 10, 10, 9, 9, 9, 9], recompute="full"),
    "pp1-zero0-fp16": dict(dp=120, tp=8, pp=1, micro_batch=2, global_batch=1920, schedule="1f1b", virtual_stages=1, zero=0,
                           stages=[], recompute="none", precision="amp-fp16", sequence_parallel=False,
                           placement="PDT"),
    "gpipe-even": dict(dp=6, tp=4, pp=40, micro_batch=4, schedule="gpipe", virtual_stages=1, zero=1,
                       stages=[], offload="optimizer", placement="TDP"),
    "uneven-ends": dict(dp=12, tp=8, pp=10, schedule="1f1b", virtual_stages=1, zero=1,
                        stages=[8, 10, 10, 10, 10, 10, 10, 10, 10, 8]),
    "interleaved-even": dict(dp=15, tp=8, pp=8, virtual_stages=2, zero=1, stages=[]),
}
# what each target cannot run (the exporter must refuse, not note): variant -> {format: message part}
CANNOT = {
    "even-1f1b-zero3": {"deepspeed": "ZeRO stage 0 or 1"},
}


def _runnable(fmt):
    return sorted(v for v in VARIANTS if fmt not in CANNOT.get(v, {}))


def plan_for(variant: str):
    doc = json.loads(EXAMPLE.read_text())
    doc["plan"].update(VARIANTS[variant])
    p = doc["plan"]
    p["num_microbatches"] = p["global_batch"] // (p["dp"] * p["micro_batch"])
    return plan_from_document(doc)


def megatron_args(text: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                 "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
                 "--global-batch-size", "--num-layers-per-virtual-pipeline-stage",
                 "--num-virtual-stages-per-pipeline-rank", "--recompute-num-layers",
                 "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--pipeline-model-parallel-layout")
    parser.add_argument("--recompute-granularity", choices=["full", "selective"])
    parser.add_argument("--recompute-method", choices=["uniform", "block"])
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--bf16", "--fp16",
                 "--use-tp-pp-dp-mapping", "--optimizer-cpu-offload"):
        parser.add_argument(flag, action="store_true")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return parser.parse_args(shlex.split(" ".join(lines)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_torchtitan_round_trip(variant):
    plan, cfg = plan_for(variant), plan_for(variant).config
    doc = tomllib.loads(export_plan(plan, "torchtitan").text)
    par, training = doc["parallelism"], doc["training"]
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == cfg.dp
    assert (par["data_parallel_shard_degree"] > 1) == (cfg.zero >= 1 and cfg.dp > 1)
    assert par["tensor_parallel_degree"] == cfg.tp and par["pipeline_parallel_degree"] == cfg.pp
    assert training["global_batch_size"] == cfg.global_batch
    assert training["local_batch_size"] * cfg.dp == cfg.global_batch
    assert training["seq_len"] == cfg.seq
    assert doc["activation_checkpoint"]["mode"] == cfg.recompute
    if cfg.pp > 1:
        assert par["pipeline_parallel_microbatch_size"] == cfg.micro_batch
        assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == cfg.num_microbatches
        if "pipeline_parallel_layers_per_stage" in par:
            assert par["pipeline_parallel_layers_per_stage"] * cfg.pp * cfg.virtual_stages == 96
        else:
            parts = par["module_fqns_per_model_part"]
            counts = [sum(n.startswith("layers.") for n in part) for part in parts]
            assert sum(counts) == 96 and len(counts) == cfg.pp * cfg.virtual_stages
            assert counts == list(cfg.stages or even_split(96, cfg.pp * cfg.virtual_stages))
            assert parts[0][0] == "tok_embeddings" and parts[-1][-1] == "output"


def test_torchtitan_schedule_names():
    assert tomllib.loads(export_plan(plan_for("uneven-interleaved"), "torchtitan").text)[
        "parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert tomllib.loads(export_plan(plan_for("gpipe-even"), "torchtitan").text)[
        "parallelism"]["pipeline_parallel_schedule"] == "GPipe"


@pytest.mark.parametrize("variant", _runnable("megatron"))
def test_megatron_round_trip(variant):
    plan = plan_for(variant)
    cfg = plan.config
    ns = megatron_args(export_plan(plan, "megatron").text)
    assert ns.tensor_model_parallel_size == cfg.tp and ns.pipeline_model_parallel_size == cfg.pp
    assert ns.micro_batch_size == cfg.micro_batch and ns.global_batch_size == cfg.global_batch
    assert ns.seq_length == cfg.seq
    assert ns.sequence_parallel == (cfg.sequence_parallel and cfg.tp > 1)
    assert ns.use_distributed_optimizer == (cfg.zero >= 1)
    assert ns.bf16 == (cfg.precision in ("amp-bf16", "bf16")) and ns.fp16 == (cfg.precision == "amp-fp16")
    assert ns.recompute_granularity == (None if cfg.recompute == "none" else cfg.recompute)
    assert ns.use_tp_pp_dp_mapping == (cfg.placement == "DPT")
    # the blocks per model chunk Megatron-LM will build, from whichever option the export used
    chunks = cfg.pp * cfg.virtual_stages
    if ns.pipeline_model_parallel_layout:
        built = layout_blocks(ns.pipeline_model_parallel_layout)
    elif ns.decoder_first_pipeline_num_layers is not None:
        first, last = ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers
        middle = (96 - first - last) // (cfg.pp - 2)
        assert first + last + middle * (cfg.pp - 2) == 96
        built = [first] + [middle] * (cfg.pp - 2) + [last]
    elif ns.num_layers_per_virtual_pipeline_stage:
        built = [ns.num_layers_per_virtual_pipeline_stage] * chunks
    else:
        assert 96 % cfg.pp == 0
        built = [96 // cfg.pp] * cfg.pp
    assert built == list(cfg.stages or even_split(96, chunks))
    # data-parallel size Megatron derives from the world size
    assert plan.gpus // (ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size) == cfg.dp


def layout_blocks(layout: str) -> list[int]:
    """Decoder blocks per chunk of a Megatron-LM layout string; checks E first and L last, once each."""
    segments = layout.split("|")
    assert segments[0].startswith("E") and segments[-1].endswith("L") and layout.count("E") == layout.count("L") == 1
    blocks = []
    for seg in segments:
        body = seg.removeprefix("E").removesuffix("L")
        n = int(body[2:]) if body.startswith("t*") else body.count("t")
        assert body in ("t" * n, f"t*{n}")
        blocks.append(n)
    return blocks


def test_megatron_layout_string():
    from planner.exports import megatron_layout
    assert megatron_layout([4, 5, 3]) == "Et*4|t*5|t*3L"
    assert layout_blocks(megatron_layout([4, 5, 3])) == [4, 5, 3]


def test_megatron_uneven_ends():
    ns = megatron_args(export_plan(plan_for("uneven-ends"), "megatron").text)
    assert (ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers) == (8, 8)
    # Megatron-LM splits the other 80 layers evenly over the 8 middle stages: 10 each, as planned
    assert (96 - 8 - 8) // (10 - 2) == 10


@pytest.mark.parametrize("variant,fmt", [(v, f) for v, fmts in CANNOT.items() for f in fmts])
def test_a_plan_the_target_cannot_run_is_refused_not_noted(variant, fmt):
    with pytest.raises(ConfigError, match="cannot export to " + fmt + ": .*" + CANNOT[variant][fmt]):
        export_plan(plan_for(variant), fmt)


@pytest.mark.parametrize("variant", _runnable("deepspeed"))
def test_deepspeed_round_trip(variant):
    plan = plan_for(variant)
    cfg = plan.config
    doc = json.loads(export_plan(plan, "deepspeed").text)
    assert doc["train_batch_size"] == cfg.global_batch
    assert doc["train_micro_batch_size_per_gpu"] == cfg.micro_batch
    assert doc["gradient_accumulation_steps"] == cfg.num_microbatches
    assert doc["train_micro_batch_size_per_gpu"] * doc["gradient_accumulation_steps"] * cfg.dp == doc["train_batch_size"]
    assert doc["zero_optimization"]["stage"] == cfg.zero
    assert ("offload_optimizer" in doc["zero_optimization"]) == (cfg.offload == "optimizer")
    assert doc["bf16"]["enabled"] == (cfg.precision in ("amp-bf16", "bf16"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sagemaker_round_trip(variant):
    plan = plan_for(variant)
    cfg = plan.config
    doc = json.loads(export_plan(plan, "sagemaker").text)
    params = doc["smdistributed"]["modelparallel"]["parameters"]
    assert params["pipeline_parallel_degree"] == params["partitions"] == cfg.pp
    assert params["tensor_parallel_degree"] == cfg.tp
    assert params["microbatches"] == cfg.num_microbatches
    assert params["placement_strategy"] == cfg.placement
    assert params["pipeline"] == ("simple" if cfg.schedule == "gpipe" else "interleaved")
    assert params["shard_optimizer_state"] == (cfg.zero >= 1)
    assert doc["mpi"]["processes_per_host"] == 8


def test_unknown_format_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        export_plan(plan_for("uneven-interleaved"), "jax")
    assert err.value.field == "format"


runner = CliRunner()


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_export_writes_file(fmt, tmp_path):
    out = tmp_path / f"cfg.{fmt}"
    result = runner.invoke(app, ["export", str(EXAMPLE), "--format", fmt, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == export_plan(plan_for("uneven-interleaved"), fmt).text


def test_cli_export_stdout_is_the_config():
    result = runner.invoke(app, ["export", str(EXAMPLE), "--format", "deepspeed"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["train_batch_size"] == 1440


@pytest.mark.parametrize("content,needle", [('{"schema_version": "7"}', "schema_version"), ("{oops", "JSON"),
                                            (None, "readable")])
def test_cli_export_rejects_bad_plans_in_one_line(content, needle, tmp_path):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["export", str(path), "--format", "megatron"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error:")


def test_cli_export_unknown_format_exit_2():
    result = runner.invoke(app, ["export", str(EXAMPLE), "--format", "jax"])
    assert result.exit_code == 2 and "format" in result.stderr


def test_cli_export_refuses_what_the_target_cannot_run(tmp_path):
    doc = json.loads(EXAMPLE.read_text())
    doc["plan"].update(VARIANTS["even-1f1b-zero3"])
    path, out = tmp_path / "plan.json", tmp_path / "ds.json"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["export", str(path), "--format", "deepspeed", "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot export to deepspeed: ") and "ZeRO-3" in lines[0]

