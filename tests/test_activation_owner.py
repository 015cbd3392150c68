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
from planner.run_options import RunOptions

runner = CliRunner()
CASES = [
    (fw, model, recompute)
    for fw in ("megatron", "torchtitan", "fsdp", "deepspeed")
    for model in ("llama3-8b", "gpt2-medium")
    for recompute in ("none", "selective", "full")
]


@pytest.mark.parametrize("model", ["llama3-8b", "gpt2-medium"])
def test_fsdp_mixed_precision_is_the_same_in_profile_and_estimate(model):
    """ZeRO-3 under FSDP's mixed precision: eager modules on 16-bit weights (cost_models.activations.activation_precision)
    save less than with fp32 weights under autocast, in the profile and in estimate alike."""
    seq = 4096 if model.startswith("llama") else 1024
    cfg = ParallelConfig(
        dp=2, micro_batch=2, global_batch=4, seq=seq, framework="fsdp", zero=3, precision="amp-bf16"
    )
    est = estimate(get(model), "dgx-h100", cfg, gpus=2)
    sharded = profile_model(
        model, seq=seq, micro_batch=2, precision="amp-bf16", framework="fsdp", zero=3
    )
    ddp = profile_model(
        model, seq=seq, micro_batch=2, precision="amp-bf16", framework="fsdp", zero=0
    )
    saved = est.to_document()["prediction"]["memory"]["saved_activations_bytes"]
    assert saved == pytest.approx(sharded.activation_bytes("none"), rel=1e-9)
    assert sharded.activation_bytes("none") < ddp.activation_bytes("none")


@pytest.mark.parametrize("framework,model,recompute", CASES)
def test_profile_estimate_and_partitioner_report_the_same_activation_bytes(
    framework, model, recompute
):
    seq = 4096 if model.startswith("llama") else 1024
    cfg = ParallelConfig(
        micro_batch=2,
        global_batch=2,
        seq=seq,
        recompute=recompute,
        framework=framework,
        precision="amp-bf16",
    )
    if violations(load_framework(framework), cfg):
        pytest.skip(
            f"{framework} does not run recompute={recompute}"
        )  # nothing to compare: estimate refuses it
    est = estimate(get(model), "dgx-h100", cfg, gpus=1)
    memory = est.to_document()["prediction"]["memory"]
    prof = profile_model(model, seq=seq, micro_batch=2, precision="amp-bf16", framework=framework)
    assert memory["saved_activations_bytes"] == pytest.approx(
        prof.activation_bytes(recompute), rel=1e-9
    )
    if memory["activations_bytes"]:  # the peak is an activation moment: the same bytes are in it
        assert memory["activations_bytes"] == memory["saved_activations_bytes"]
    block = next(layer for layer in prof.layers if layer.kind == "block")
    problem = stage_problem(get(model).with_(seq=seq), cfg)
    assert problem.block_activation_bytes[0] == pytest.approx(
        block.activation_bytes[recompute], rel=1e-12
    )


def test_the_cli_commands_agree_too():
    argv = ["llama3-8b", "--seq", "8192", "--framework", "torchtitan", "--precision", "amp-bf16"]
    prof = json.loads(runner.invoke(app, ["profile", *argv, "--micro-batch", "1", "--json"]).stdout)
    est = json.loads(
        runner.invoke(
            app,
            [
                "estimate",
                *argv,
                "--hardware",
                "p5.48xlarge",
                "--gpus",
                "1",
                "--global-batch",
                "1",
                "--json",
            ],
        ).stdout
    )
    assert (
        est["prediction"]["memory"]["saved_activations_bytes"] == prof["activations_bytes"]["none"]
    )


OPTION_CASES = [
    # (framework, precision, tp, sp, recompute, run options)
    ("megatron", "fp8", 1, False, "none", {"activation_fp8_input": True}),
    ("megatron", "fp8", 1, False, "selective", {"activation_fp8_input": True}),
    ("megatron", "amp-bf16", 1, False, "selective", {"recompute_modules": ["core_attn", "mlp"]}),
    (
        "megatron",
        "fp8",
        1,
        False,
        "selective",
        {"recompute_modules": ["layernorm"], "activation_fp8_input": True},
    ),
    ("megatron", "amp-bf16", 4, True, "selective", {}),
    ("megatron", "amp-bf16", 4, False, "none", {}),
    ("torchtitan", "amp-bf16", 2, True, "selective", {}),
]


@pytest.mark.parametrize("framework,precision,tp,sp,recompute,options", OPTION_CASES)
def test_run_options_reach_profile_estimate_and_partitioner_alike(
    framework, precision, tp, sp, recompute, options
):
    """The options that change what a block saves (Megatron-Core's activation_func_fp8_input_store and
    recompute_modules, tensor and sequence parallelism) give the same bytes in all three readers: they all read
    cost_models.activations.block_bytes_of / cost_models.activations.block_table_of. Each option also changes the bytes
    (else the case would not test that it is passed on)."""
    from planner.software import software_for

    seq = 4096
    cfg = ParallelConfig(
        tp=tp,
        sequence_parallel=sp,
        micro_batch=2,
        global_batch=2,
        seq=seq,
        recompute=recompute,
        framework=framework,
        precision=precision,
    )
    options = RunOptions(**options)
    est = estimate(get("llama3-8b"), "dgx-h100", cfg, gpus=tp, options=options)
    prof = profile_model(
        "llama3-8b",
        seq=seq,
        micro_batch=2,
        precision=precision,
        framework=framework,
        tp=tp,
        sp=sp,
        options=options,
    )
    saved = est.to_document()["prediction"]["memory"]["saved_activations_bytes"]
    assert saved == pytest.approx(prof.activation_bytes(recompute), rel=1e-9)
    block = next(layer for layer in prof.layers if layer.kind == "block")
    problem = stage_problem(get("llama3-8b").with_(seq=seq), cfg, software_for(framework, options))
    assert problem.block_activation_bytes[0] == pytest.approx(
        block.activation_bytes[recompute], rel=1e-12
    )
    plain = profile_model(
        "llama3-8b", seq=seq, micro_batch=2, precision=precision, framework=framework
    )
    assert prof.activation_bytes(recompute) < plain.activation_bytes(recompute)


def test_profile_cli_takes_the_run_options_estimate_takes():
    argv = [
        "llama3-70b",
        "--seq",
        "8192",
        "--framework",
        "megatron",
        "--precision",
        "fp8",
        "--tp",
        "8",
        "--sequence-parallel",
        "--recompute-modules",
        "core_attn,mlp",
        "--activation-fp8-input",
        "--loss",
        "inplace",
    ]
    prof = json.loads(runner.invoke(app, ["profile", *argv, "--micro-batch", "1", "--json"]).stdout)
    est = json.loads(
        runner.invoke(
            app,
            [
                "estimate",
                *argv,
                "--hardware",
                "p5.48xlarge",
                "--gpus",
                "8",
                "--global-batch",
                "1",
                "--recompute",
                "selective",
                "--json",
            ],
        ).stdout
    )
    assert (
        est["prediction"]["memory"]["saved_activations_bytes"]
        == prof["activations_bytes"]["selective"]
    )
    assert (prof["tp"], prof["sequence_parallel"]) == (8, True)
    assert (
        prof["software"]["loss"] == "inplace" and prof["software"]["activation_fp8_input"] is True
    )
    assert prof["software"]["recompute_modules"] == ["core_attn", "mlp"]
    from cost_models import activations as A

    loss = next(layer for layer in prof["layers"] if layer["kind"] == "loss")
    spec = get("llama3-70b")
    assert loss["activations_bytes"]["none"] == int(
        A.loss_bytes(spec, 1, 8192, tp=8, loss="inplace", precision="fp8")
    )


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--tp", "2", "--framework", "fsdp"], None),
        (["--sequence-parallel"], "sequence_parallel=True is invalid"),
        (
            ["--activation-fp8-input", "--framework", "torchtitan"],
            "cannot run this plan: activation_fp8_input",
        ),
        (
            ["--activation-fp8-input", "--model", "gpt2-medium"],
            "activation_fp8_input needs a SwiGLU MLP",
        ),
        (["--recompute-modules", "attention"], "recompute_modules="),
        (
            ["--recompute-modules", "mlp", "--framework", "fsdp"],
            "cannot run this plan: recompute_modules=mlp",
        ),
        (["--loss", "fancy"], "loss='fancy' is invalid"),
        (["--tp", "0"], None),
        (
            ["--model", "tests.fixtures.factories:small_llama", "--tp", "2"],
            "tp=2 is invalid: allowed 1 for a module factory",
        ),
    ],
)
def test_profile_run_option_errors_are_one_line(argv, match):
    """Each bad run option: exit 2 with one line naming it (or typer's range check), never a traceback; a
    valid one (tp 2 on fsdp) runs."""
    model = "llama3-8b"
    if "--model" in argv:
        i = argv.index("--model")
        model, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
    result = runner.invoke(app, ["profile", model, "--precision", "fp8", *argv])
    if argv[:2] == ["--tp", "2"] and model == "llama3-8b":
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    if match:
        assert match in result.output and len(result.output.strip().splitlines()) == 1, (
            result.output
        )
