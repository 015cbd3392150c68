"""One activation model: `planner profile`, `planner estimate` and the stage partitioner report the same
activation bytes for the same configuration (they all read cost_models.blocks through
cost_models.activations / cost_models.memory), on every framework's kernels."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from frameworks import load_framework
from frameworks.rules import violations
from planner.catalog import get
from planner.cli import app
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.profiler import profile_model
from planner.search import stage_problem

runner = CliRunner()
CASES = [(fw, model, recompute) for fw in ("megatron", "torchtitan", "fsdp", "deepspeed")
         for model in ("llama3-8b", "gpt2-medium") for recompute in ("none", "selective", "full")]


@pytest.mark.parametrize("model", ["llama3-8b", "gpt2-medium"])
def test_fsdp_mixed_precision_is_the_same_in_profile_and_estimate(model):
    """ZeRO-3 under FSDP's mixed precision: eager modules on 16-bit weights (cost_models.step.activation_precision)
    save less than with fp32 weights under autocast, in the profile and in estimate alike."""
    seq = 4096 if model.startswith("llama") else 1024
    cfg = ParallelConfig(dp=2, micro_batch=2, global_batch=4, seq=seq, framework="fsdp", zero=3, precision="amp-bf16")
    est = estimate(get(model), "dgx-h100", cfg, gpus=2)
    sharded = profile_model(model, seq=seq, micro_batch=2, precision="amp-bf16", framework="fsdp", zero=3)
    ddp = profile_model(model, seq=seq, micro_batch=2, precision="amp-bf16", framework="fsdp", zero=0)
    saved = est.to_document()["prediction"]["memory"]["saved_activations_bytes"]
    assert saved == pytest.approx(sharded.activation_bytes("none"), rel=1e-9)
    assert sharded.activation_bytes("none") < ddp.activation_bytes("none")


@pytest.mark.parametrize("framework,model,recompute", CASES)
def test_profile_estimate_and_partitioner_report_the_same_activation_bytes(framework, model, recompute):
    seq = 4096 if model.startswith("llama") else 1024
    cfg = ParallelConfig(micro_batch=2, global_batch=2, seq=seq, recompute=recompute, framework=framework,
                         precision="amp-bf16")
    if violations(load_framework(framework), cfg):
        pytest.skip(f"{framework} does not run recompute={recompute}")   # nothing to compare: estimate refuses it
    est = estimate(get(model), "dgx-h100", cfg, gpus=1)
    memory = est.to_document()["prediction"]["memory"]
    prof = profile_model(model, seq=seq, micro_batch=2, precision="amp-bf16", framework=framework)
    assert memory["saved_activations_bytes"] == pytest.approx(prof.activation_bytes(recompute), rel=1e-9)
    if memory["activations_bytes"]:         # the peak is an activation moment: the same bytes are in it
        assert memory["activations_bytes"] == memory["saved_activations_bytes"]
    block = next(layer for layer in prof.layers if layer.kind == "block")
    problem = stage_problem(get(model).with_(seq=seq), cfg)
    assert problem.block_activation_bytes[0] == pytest.approx(block.activation_bytes[recompute], rel=1e-12)


def test_the_cli_commands_agree_too():
    argv = ["llama3-8b", "--seq", "8192", "--framework", "torchtitan", "--precision", "amp-bf16"]
    prof = json.loads(runner.invoke(app, ["profile", *argv, "--micro-batch", "1", "--json"]).stdout)
    est = json.loads(runner.invoke(app, ["estimate", *argv, "--hardware", "p5.48xlarge", "--gpus", "1",
                                         "--global-batch", "1", "--json"]).stdout)
    assert est["prediction"]["memory"]["saved_activations_bytes"] == prof["activations_bytes"]["none"]
