"""nn.Module factories measured on the meta device: equal to the analytic profile where both apply,
shared parameters and BatchNorm detected, fvcore as a cross-check of the linear layers, GPT-3 175B
in well under 30 s without parameter memory, and every bad factory is exit 2."""

import json
import resource
import time

import pytest
import torch
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.module_profiler import build_on_meta, profile_module
from planner.profiler import profile_model, profile_spec
from planner.sources import resolve_model
from tests.fixtures.factories import SMALL_GPT, SMALL_LLAMA
from planner.run_options import RunOptions

runner = CliRunner()


def dtype_bytes(precision):
    return 4 if precision == "fp32" else 2


def _with_loss(profile, mode):
    """The analytic total plus its loss row (what a measurement of the whole model and loss sees)."""
    return profile.activation_bytes(mode) + sum(
        u.activation_bytes[mode] for u in profile.layers if u.kind == "loss"
    )


@pytest.mark.parametrize("factory,spec", [("small_gpt", SMALL_GPT), ("small_llama", SMALL_LLAMA)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_meta_measurement_equals_the_analytic_profile_per_block(factory, spec, precision):
    measured = profile_module(
        f"tests.fixtures.factories:{factory}", micro_batch=2, precision=precision
    )
    # torch kernels; CPU SDPA runs its flash kernel in fp32 too; the reference model's selective
    # recompute checkpoints the attention core (not torchtitan's per-operator policy)
    analytic = profile_spec(
        spec,
        micro_batch=2,
        precision=precision,
        framework="torchtitan",
        selective="attention",
        options=RunOptions(attention="flash"),
    )
    blocks_m = [u for u in measured.units if u.kind == "block"]
    blocks_a = [u for u in analytic.layers if u.kind == "block"]
    assert [u.name for u in blocks_m] == [u.name for u in blocks_a]
    rope_bytes = (
        2 * spec.seq * spec.d_head * 4 * (spec.position == "rope")
    )  # fp32 cos/sin, shared by all blocks
    for i, (m, a) in enumerate(zip(blocks_m, blocks_a)):
        assert m.params == a.params
        assert m.flops_fwd == pytest.approx(a.flops_fwd, rel=1e-9)
        assert m.flops_bwd == pytest.approx(a.flops_bwd, rel=1e-9)
        for mode in ("none", "selective", "full"):
            assert m.recompute_flops[mode] == pytest.approx(a.recompute_flops[mode], rel=1e-9)
            # The first block also keeps the RoPE tables; the analytic profile charges them to the embedding.
            shared = rope_bytes * (dtype_bytes(precision) / 4) if i == 0 else 0
            assert m.activation_bytes[mode] - shared == pytest.approx(
                a.activation_bytes[mode], rel=0.05
            )
    p = measured.profile
    assert p.params == analytic.params
    assert p.flops_fwd + p.flops_bwd == pytest.approx(
        analytic.flops_fwd + analytic.flops_bwd, rel=0.02
    )
    for mode in (
        "none",
        "selective",
        "full",
    ):  # a measured profile also holds the loss's saved log-softmax
        assert p.activation_bytes(mode) == pytest.approx(_with_loss(analytic, mode), rel=0.05)


def test_tied_embedding_is_a_shared_parameter_group_counted_once():
    ms = resolve_model("tests.fixtures.factories:small_gpt")
    assert ms.shared_params == (("tok_embeddings.weight", "output.weight"),)
    assert ms.params == sum(u.params for u in ms.units) == profile_spec(SMALL_GPT).params
    assert not ms.has_batchnorm and ms.total_blocks == SMALL_GPT.layers and ms.spec == SMALL_GPT


def test_generic_module_with_example_inputs_batchnorm_and_tied_linears():
    ms = profile_module("tests.fixtures.factories:convnet", seq=8, micro_batch=4, precision="fp32")
    assert ms.has_batchnorm
    assert ms.shared_params == (("fc1.weight", "fc2.weight"),)
    conv = next(u for u in ms.units if u.name == "conv")
    assert conv.flops_fwd == 2 * 4 * 8 * 8 * 8 * 3 * 3 * 3  # 2 x N x H x W x C_out x C_in x k x k
    assert ms.params == 8 * 3 * 9 + 8 + 16 + 64 + 8 + 8


def test_fvcore_agrees_on_the_linear_layers():
    """fvcore counts forward multiply-adds of nn.Linear (and skips attention): 2 x its count
    must equal our forward FLOPs of each block minus the attention core."""
    fvcore = pytest.importorskip("fvcore.nn")
    model = build_on_meta("tests.fixtures.factories:small_llama", "fp32")
    tokens = torch.zeros((2, SMALL_LLAMA.seq), dtype=torch.long, device="meta")
    analysis = fvcore.FlopCountAnalysis(model, (tokens,))
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings(
        "none"
    )
    by_module = analysis.by_module()
    ms = profile_module("tests.fixtures.factories:small_llama", micro_batch=2, precision="fp32")
    core = 4 * 2 * SMALL_LLAMA.seq**2 * SMALL_LLAMA.attn_width
    for unit in ms.units:
        if unit.kind == "block":
            linears = by_module[f"{unit.name}.attention"] + by_module[f"{unit.name}.feed_forward"]
            assert 2 * linears == unit.flops_fwd - core
    assert 2 * by_module["output"] == next(u for u in ms.units if u.name == "output").flops_fwd


def test_gpt3_175b_factory_profiles_fast_on_meta_without_parameter_memory():
    model = build_on_meta("tests.fixtures.factories:gpt3_175b", "bf16")
    assert all(p.device.type == "meta" for p in model.parameters())
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu_start = time.process_time()
    ms = profile_module("tests.fixtures.factories:gpt3_175b", micro_batch=1, precision="bf16")
    cpu_s = time.process_time() - cpu_start
    rss_growth_bytes = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib) * 1024
    assert cpu_s < 30  # CPU seconds: the wall time on an idle 2-core machine (single-threaded work)
    assert rss_growth_bytes < 1 << 30  # 175B bf16 parameters would be 350 GB
    analytic = profile_spec(
        catalog.get("gpt3-175b"),
        micro_batch=1,
        precision="bf16",
        framework="torchtitan",
        selective="attention",
    )  # the reference model's selective recompute
    p = ms.profile
    assert ms.params == analytic.params == 174_604_259_328
    assert p.flops_fwd == pytest.approx(analytic.flops_fwd, rel=1e-9)
    assert p.flops_bwd == pytest.approx(analytic.flops_bwd, rel=1e-9)
    for mode in (
        "none",
        "selective",
        "full",
    ):  # a measured profile also holds the loss's saved log-softmax
        assert p.activation_bytes(mode) == pytest.approx(_with_loss(analytic, mode), rel=0.05)


def test_analytic_gpt3_175b_profile_is_instant():
    start = time.perf_counter()
    result = runner.invoke(app, ["profile", "gpt3-175b", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["params"] == 174_604_259_328
    assert time.perf_counter() - start < 5


def test_factory_through_the_cli_and_profile_model():
    result = runner.invoke(
        app, ["profile", "tests.fixtures.factories:small_llama", "--micro-batch", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["method"] == "meta-device measurement" and doc["micro_batch"] == 2
    assert doc["params"] == profile_spec(SMALL_LLAMA).params
    again = profile_model("tests.fixtures.factories:small_llama", micro_batch=2)
    assert again.flops_fwd == doc["flops"]["forward"]


@pytest.mark.parametrize(
    "arg,needle",
    [
        ("tests.fixtures.factories:nope", "nope"),
        ("no_such_package.models:build", "no_such_package"),
        ("tests.fixtures.factories:not_a_module", "nn.Module"),
        ("tests.fixtures.factories:", "package.module:factory"),
        (
            "tests.fixtures.factories:shape_bug",
            "forward/backward on the meta device failed (RuntimeError",
        ),
    ],
)
def test_bad_factories_are_one_line_and_exit_2(arg, needle):
    result = runner.invoke(app, ["profile", arg])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.output


def test_a_module_with_float_inputs_profiles_in_every_precision():
    # example_inputs come in float32; the profiler casts them to the dtype it ran the module in
    for precision in ("amp-bf16", "bf16", "fp32"):
        result = runner.invoke(
            app,
            [
                "profile",
                "tests.fixtures.factories:convnet",
                "--seq",
                "8",
                "--precision",
                precision,
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        assert (
            json.loads(result.stdout)["params"] == 3 * 8 * 9 + 8 + 2 * 8 + 8 * 8 + 8 + 8
        )  # conv, bn, fc1, fc2 bias (weight tied)
