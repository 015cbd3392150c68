"""Megatron-Core's MoE layer and its selective recomputation by module (cost_models.blocks.moe_mla_bytes_per_token
with kernels 'fused', cost_models.blocks.module_sac, planner.estimate's recompute_modules)."""

from __future__ import annotations

import itertools

import pytest

from cost_models import blocks as B
from planner.catalog import get
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.run_options import RunOptions

QWEN = get("qwen3-30b-a3b")  # h 2048, top-8 of 128 experts of width 768, SwiGLU
DSV3 = get("deepseek-v3")  # MLA + MoE with a shared expert


def test_megatron_core_keeps_only_the_routed_fc1_input_probability_and_map_per_routed_copy():
    """Golden per-token dispatch bytes: Megatron-Core saves k (h c_in + 4 + 16) (TE GroupedLinear's fc1 input, 1
    byte under FP8; the fp32 routed probability; the permutation map), the eager layer k (3 h c + c + 16)."""
    k, h = QWEN.moe.top_k, QWEN.hidden
    rep, _ = B.moe_mla_bytes_per_token(QWEN, 2, kernels="fused", precision="amp-bf16")
    assert rep["moe_dispatch"] == k * (h * 2 + 20) == 32_928
    rep, _ = B.moe_mla_bytes_per_token(QWEN, 2, kernels="fused", precision="fp8")
    assert rep["moe_dispatch"] == k * (h + 20)
    rep, _ = B.moe_mla_bytes_per_token(QWEN, 2, kernels="eager", precision="amp-bf16")
    assert rep["moe_dispatch"] == k * (3 * h * 2 + 2 + 16)
    fused = B.block_table(QWEN, "amp-bf16", "fused").saved
    eager_dispatch = B.moe_mla_bytes_per_token(QWEN, 2)[0]["moe_dispatch"]
    assert (
        fused.rep
        < B.block_table(
            QWEN.with_(moe=None, ffn=QWEN.moe.active_ffn), "amp-bf16", "fused"
        ).saved.rep
        + eager_dispatch
    )


def test_core_attn_alone_is_megatrons_default_selective_recomputation():
    cfg = ParallelConfig(
        dp=8,
        tp=2,
        pp=2,
        ep=8,
        micro_batch=1,
        global_batch=64,
        seq=4096,
        recompute="selective",
        precision="amp-bf16",
        sequence_parallel=True,
        placement="PDET",
    )
    default = estimate(QWEN, "p5.48xlarge", cfg, gpus=32)
    named = estimate(
        QWEN, "p5.48xlarge", cfg, gpus=32, options=RunOptions(recompute_modules=["core_attn"])
    )
    assert (
        named.step_time_s == default.step_time_s
        and named.peak_bytes_per_gpu == default.peak_bytes_per_gpu
    )
    assert named.to_document()["software"]["recompute_modules"] == ["core_attn"]
    assert "recompute_modules" not in default.to_document()["software"]


def _run(spec, modules, *, precision="amp-bf16", ep=8):
    cfg = ParallelConfig(
        dp=8,
        tp=1,
        pp=1,
        ep=ep,
        micro_batch=1,
        global_batch=16,
        seq=4096,
        recompute="selective",
        precision=precision,
        placement="DPET" if ep > 1 else "DPT",
    )
    return estimate(spec, "p5.48xlarge", cfg, gpus=8, options=RunOptions(recompute_modules=modules))


@pytest.mark.parametrize("spec", [QWEN, DSV3], ids=["qwen3-30b", "deepseek-v3"])
def test_recomputing_more_modules_never_holds_more_nor_recomputes_less(spec):
    """Over every pair of module sets where one contains the other (all seven names, both models): the larger set
    keeps no more activations and spends no less time re-running forwards."""
    names = B.RECOMPUTE_MODULES
    sets = [s for n in (1, 2, 7) for s in itertools.combinations(names, n)]
    runs = {s: _run(spec, s) for s in sets}
    for small, large in itertools.product(sets, sets):
        if set(small) < set(large):
            a, b = runs[small].scores, runs[large].scores
            assert float(b.saved_activations_bytes[0]) <= float(a.saved_activations_bytes[0]) * (
                1 + 1e-12
            ), (small, large)
            assert float(b.recompute[0]) >= float(a.recompute[0]) * (1 - 1e-12), (small, large)


def test_the_moe_module_keeps_the_layer_input_only_and_exchanges_again():
    """recompute_modules ['moe'] frees the router and dispatch terms and the expert MLPs' inner tensors (k f_e + S
    f_s wide), exactly; its backward re-runs the expert GEMMs and the dispatch and combine exchanges."""
    none, moe = _run(QWEN, ["moe_act"]), _run(QWEN, ["moe_act", "moe"])
    c, k, f = 2, QWEN.moe.top_k, QWEN.moe.expert_ffn
    rep, _ = B.moe_mla_bytes_per_token(QWEN, c, kernels="fused", precision="amp-bf16")
    per_token = (
        sum(v for n, v in rep.items() if n.startswith("moe_")) + (2 * c + c) * k * f - c * k * f
    )  # moe_act's share freed already
    tokens = 4096
    freed = float(none.scores.saved_activations_bytes[0]) - float(
        moe.scores.saved_activations_bytes[0]
    )
    assert freed == pytest.approx(
        per_token * tokens * QWEN.total_blocks, rel=1e-9
    )  # every block, one in flight
    assert float(moe.scores.ep_comm[0]) > float(none.scores.ep_comm[0])
    assert float(moe.scores.recompute[0]) > float(none.scores.recompute[0])


def test_mla_up_proj_frees_q_k_v_and_re_runs_the_up_projections():
    base, up = _run(DSV3, ["core_attn"]), _run(DSV3, ["core_attn", "mla_up_proj"])
    _, shard = B.moe_mla_bytes_per_token(DSV3, 2, kernels="fused", precision="amp-bf16")
    freed = float(base.scores.saved_activations_bytes[0]) - float(
        up.scores.saved_activations_bytes[0]
    )
    assert freed == pytest.approx(shard["qkv"] * 4096 * DSV3.total_blocks, rel=1e-9)
    assert float(up.scores.recompute[0]) > float(base.scores.recompute[0])


def test_a_module_the_model_does_not_have_frees_nothing():
    dense = get("llama3-8b")
    cfg = ParallelConfig(
        dp=8, micro_batch=1, global_batch=16, seq=4096, recompute="selective", precision="amp-bf16"
    )
    attn = estimate(
        dense, "p5.48xlarge", cfg, gpus=8, options=RunOptions(recompute_modules=["core_attn"])
    )
    more = estimate(
        dense,
        "p5.48xlarge",
        cfg,
        gpus=8,
        options=RunOptions(recompute_modules=["core_attn", "moe", "moe_act", "mla_up_proj"]),
    )
    assert more.peak_bytes_per_gpu == attn.peak_bytes_per_gpu and more.step_time_s == pytest.approx(
        attn.step_time_s
    )
    mlp = estimate(
        dense,
        "p5.48xlarge",
        cfg,
        gpus=8,
        options=RunOptions(recompute_modules=["core_attn", "mlp"]),
    )
    assert mlp.peak_bytes_per_gpu < attn.peak_bytes_per_gpu and mlp.step_time_s > attn.step_time_s


@pytest.mark.parametrize(
    "bad", [[], "moe", ["moe", "moe"], ["attention"], [1], ("core_attn", None)]
)
def test_recompute_modules_are_checked_in_one_line(bad):
    with pytest.raises(ConfigError, match="recompute_modules") as err:
        _run(QWEN, bad)
    assert "\n" not in str(err.value)


def test_only_a_stack_that_names_modules_takes_them():
    cfg = ParallelConfig(
        dp=8,
        micro_batch=1,
        global_batch=16,
        seq=4096,
        recompute="selective",
        precision="amp-bf16",
        framework="torchtitan",
    )
    with pytest.raises(ConfigError, match="torchtitan cannot run this plan: recompute_modules=moe"):
        estimate(QWEN, "p5.48xlarge", cfg, gpus=8, options=RunOptions(recompute_modules=["moe"]))


def test_the_cli_takes_recompute_modules_and_says_so():
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    args = [
        "estimate",
        "qwen3-30b-a3b",
        "--hardware",
        "p5.48xlarge",
        "--gpus",
        "16",
        "--dp",
        "16",
        "--ep",
        "8",
        "--micro-batch",
        "1",
        "--global-batch",
        "64",
        "--seq",
        "4096",
        "--recompute",
        "selective",
    ]
    runner = CliRunner()
    out = runner.invoke(app, args + ["--recompute-modules", "layernorm,moe", "--json"])
    doc = json.loads(out.stdout)
    assert doc["software"]["recompute_modules"] == ["layernorm", "moe"]
    plain = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    assert (
        doc["prediction"]["memory"]["peak_bytes_per_gpu"]
        < plain["prediction"]["memory"]["peak_bytes_per_gpu"]
    )
    assert (
        "recomputing layernorm, moe"
        in runner.invoke(app, args + ["--recompute-modules", "layernorm,moe"]).stdout
    )
    bad = runner.invoke(app, args + ["--recompute-modules", "layernorm,router"])
    assert (
        bad.exit_code == 2 and "recompute_modules" in bad.output and "Traceback" not in bad.output
    )


def test_recommend_costs_the_named_modules_and_explain_keeps_them():
    from planner.explain import _software_options
    from planner.search import recommend

    rec = recommend(
        "qwen3-30b-a3b",
        "p5.48xlarge",
        gpus=16,
        global_batch=64,
        seq=4096,
        top=2,
        options=RunOptions(recompute_modules=["layernorm", "moe"]),
    )
    for doc in [rec.best, *rec.alternatives]:
        assert doc["software"]["recompute_modules"] == ["layernorm", "moe"]
    assert _software_options(rec.best).recompute_modules == ("layernorm", "moe")
