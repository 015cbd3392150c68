"""FLOPs of mixture-of-experts, MLA and windowed models (cost_models.flops; docs/models.md): the published
TFLOP/s of Megatron-Bridge and NeMo AutoModel runs reproduced from our counts, the GEMM shapes the cost
model times, properties, the profile command's MoE keys, and estimate at ep=1."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cost_models import flops as F
from cost_models import params as P
from planner import catalog
from planner.cli import app
from planner.spec import MoESpec, TransformerSpec
from tests.fixtures.factories import SMALL_DEEPSEEK, SMALL_MIXTRAL

ROOT = Path(__file__).resolve().parents[1]
RUNS = json.loads((ROOT / "validation" / "published" / "moe.json").read_text())["runs"]
runner = CliRunner()


def _padded_vocab(spec: TransformerSpec, tp: int) -> TransformerSpec:
    """Megatron pads the vocabulary to a multiple of 128 x tp (the logits it counts)."""
    unit = 128 * tp
    return spec.with_(vocab=-(-spec.vocab // unit) * unit)


PUBLISHED_FLOP_RUNS = [
    r
    for r in RUNS
    if {"tflops_per_gpu", "tokens_per_s_per_gpu"} <= set(r["measured"])
    and r["model"] != "gpt-oss-120b"
]
"""Runs that print both TFLOP/s and tokens/s per GPU: their ratio is the FLOPs per token of the
software's own count (Megatron-LM num_floating_point_operations: 6 N_active + causal-halved attention +
logits + MTP; moe.json notes). gpt-oss-120b is left out: Megatron-Bridge's 27.2 GFLOP/token is below
6 N_active (30.8 G) of its published shape, so its count is not one of the model's FLOPs."""


@pytest.mark.parametrize("run", PUBLISHED_FLOP_RUNS, ids=lambda r: r["id"])
def test_published_tflops_per_token_are_our_active_flops(run):
    """TFLOP/s / tokens/s = FLOPs per token; the printed figures have 3-4 digits: within 1%. DeepSeek-V3
    under Megatron-Bridge 25.09 ran with its MTP module (260.6 G/token; without it 250.4), NeMo AutoModel
    without (249.6 G)."""
    m = run["measured"]
    published = m["tflops_per_gpu"] * 1e12 / m["tokens_per_s_per_gpu"]
    spec = _padded_vocab(catalog.get(run["model"]), run["tp"])
    if run["framework"] == "torchtitan":
        spec = spec.with_(mtp_modules=0)
    ours = F.model_flops_per_step(spec, run["seq"], seq=run["seq"], causal_half=True) / run["seq"]
    assert ours == pytest.approx(published, rel=0.01)


def test_flops_per_token_definition():
    """6 N_active + 3 x the cores' forward per token (full square), + MTP for DeepSeek-V3."""
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"):
        spec = catalog.get(name)
        s = spec.seq
        cores = sum(
            len(k.layers) * F.attention_core_flops_fwd(k.spec, 1, s) for k in spec.block_kinds
        )
        if spec.mtp_modules:
            cores += spec.mtp_modules * F.attention_core_flops_fwd(spec.last_kind, 1, s)
        n_active = P.matmul_params(spec) + P.mtp_matmul_params(spec)
        assert F.flops_per_token(spec) == pytest.approx(6 * n_active + 3 * cores / s, rel=1e-12)
        assert n_active < P.total_params(spec) + P.mtp_params(spec)


def test_mixtral_active_gemm_weights_by_hand():
    """Per block: attention 4096 x (4096 + 2 x 1024 + 4096), router 8 x 4096, two SwiGLU experts
    3 x 4096 x 14336; plus the 32000 x 4096 head."""
    spec = catalog.get("mixtral-8x7b")
    block = 4096 * (4096 + 2 * 1024 + 4096) + 8 * 4096 + 2 * 3 * 4096 * 14336
    assert P.matmul_params(spec) == 32 * block + 32000 * 4096


def test_gpt_oss_windows_count_their_band():
    """Half the blocks attend to 128 keys per query: at s = 4096 their core is 128 / 4096 of a full one."""
    spec = catalog.get("gpt-oss-120b")
    full, windowed = (k.spec for k in reversed(spec.block_kinds))
    core_full, core_windowed = (
        F.attention_core_flops_fwd(full, 1, 4096),
        F.attention_core_flops_fwd(windowed, 1, 4096),
    )
    assert core_windowed == pytest.approx(core_full / 32)
    assert F.attention_core_flops_fwd(spec, 1, 4096) == pytest.approx(
        (core_full + core_windowed) / 2
    )
    assert F.attention_core_flops_fwd(spec, 1, 64) == F.attention_core_flops_fwd(
        full, 1, 64
    )  # s <= w: no saving
    # the kernel's work: causal half of the square for full blocks, the band for windowed ones
    assert F.attention_kernel_flops_fwd(full, 1, 4096) == pytest.approx(
        F.attention_core_flops_fwd(full, 1, 4096) / 2
    )
    n = 128
    assert F.attention_kernel_flops_fwd(windowed, 1, 4096) == pytest.approx(
        2 * (4096 * n - n * n / 2) * 64 * (64 + 64)
    )


def test_mla_core_uses_both_head_widths():
    ds = catalog.get("deepseek-v3")
    b, s = 1, 4096
    assert F.attention_core_flops_fwd(ds, b, s) == 2 * b * s * s * 128 * (192 + 128)
    assert F.attention_core_flops_bwd(ds, b, s) == pytest.approx(
        2 * b * s * s * 128 * (3 * 192 + 2 * 128)
    )
    assert F.attention_core_flops_bwd(ds, b, s, flash=False) == 2 * F.attention_core_flops_fwd(
        ds, b, s
    )


@pytest.mark.parametrize(
    "name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "llama3-8b"]
)
def test_gemm_shapes_add_up_to_the_block_flops(name):
    spec = catalog.get(name)
    shapes = F.block_gemm_shapes(spec, 2, 1024)
    assert sum(g.flops for g in shapes) == pytest.approx(
        F.block_flops_fwd(spec, 2, 1024), rel=1e-12
    )


def test_expert_gemms_are_grouped_with_their_rows_per_expert_visible():
    spec = catalog.get("qwen3-30b-a3b")
    shapes = {g.name: g for g in F.block_gemm_shapes(spec, 1, 4096, tp=2)}
    w1 = shapes["experts_w1"]
    assert (w1.m, w1.n, w1.k, w1.batch) == (
        4096 * 8 / 128,
        768 / 2,
        2048,
        128,
    )  # 256 rows per expert
    assert (shapes["router"].m, shapes["router"].n) == (4096, 128)
    assert "w1" not in shapes and "shared_w1" not in shapes
    ds = {g.name: g for g in F.block_gemm_shapes(catalog.get("deepseek-v3"), 1, 4096, tp=8)}
    assert ds["shared_w1"].n == 2048 / 8 and ds["experts_w2"].m == 4096 * 8 / 256
    assert ds["wq_a"].n == 1536 and ds["wkv_a"].n == 576  # replicated down projections
    assert (
        ds["wq_b"].n == 128 / 8 * 192
        and ds["wkv_b"].n == 128 / 8 * 256
        and ds["wo"].k == 128 / 8 * 128
    )
    capped = catalog.get("qwen3-30b-a3b").with_(
        moe=MoESpec(experts=128, top_k=8, expert_ffn=768, capacity_factor=1.25)
    )
    assert {g.name: g for g in F.block_gemm_shapes(capped, 1, 4096)}[
        "experts_w1"
    ].m == 4096 * 8 / 128 * 1.25


moe_specs = st.builds(
    lambda experts, k, f, shared, layers, gated, mla: TransformerSpec(
        name="p",
        layers=layers,
        hidden=64,
        heads=4,
        kv_heads=0 if mla else 2,
        ffn=96,
        vocab=100,
        gated_mlp=gated,
        mla=dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12)
        if mla
        else None,
        moe=MoESpec(experts=experts, top_k=min(k, experts), expert_ffn=f, shared_experts=shared),
    ),
    st.integers(2, 64),
    st.integers(1, 7),
    st.integers(1, 512),
    st.integers(0, 2),
    st.integers(1, 6),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(moe_specs)
def test_flops_grow_with_top_k_and_not_with_experts(spec):
    moe = asdict(spec.moe)
    if spec.moe.top_k < spec.moe.experts:
        more_k = spec.with_(moe=MoESpec(**(moe | {"top_k": spec.moe.top_k + 1})))
        step = 2 * 1024 * P.ffn_weight_params(spec, spec.moe.expert_ffn)
        assert F.block_flops_fwd(more_k, 1, 1024) - F.block_flops_fwd(spec, 1, 1024) == step
        assert F.flops_per_token(more_k, 1024) > F.flops_per_token(spec, 1024)
    more_e = spec.with_(moe=MoESpec(**(moe | {"experts": spec.moe.experts + 1})))
    assert (
        F.block_flops_fwd(more_e, 1, 1024) - F.block_flops_fwd(spec, 1, 1024)
        == 2 * 1024 * spec.hidden
    )  # router
    shapes = F.block_gemm_shapes(spec, 2, 256)
    assert sum(g.flops for g in shapes) == pytest.approx(F.block_flops_fwd(spec, 2, 256), rel=1e-12)
    assert F.model_flops_per_step(spec, 4096, seq=1024, causal_half=True) < F.model_flops_per_step(
        spec, 4096, seq=1024
    )


def test_capacity_factor_scales_the_routed_experts_only():
    base = catalog.get("mixtral-8x7b")
    capped = base.with_(moe=MoESpec(experts=8, top_k=2, expert_ffn=14336, capacity_factor=1.5))
    routed = 2 * 4096 * 2 * P.ffn_weight_params(base, 14336)
    assert F.block_flops_fwd(capped, 1, 4096) - F.block_flops_fwd(base, 1, 4096) == pytest.approx(
        0.5 * routed
    )
    assert F.model_flops_per_step(capped, 4096) == F.model_flops_per_step(
        base, 4096
    )  # useful work only


def test_full_recompute_of_an_moe_block_skips_only_the_shared_experts_last_gemm():
    b, s = 1, 256
    mix = SMALL_MIXTRAL
    assert F.block_recompute_flops(mix, b, s, "full") == F.block_flops_fwd(mix, b, s)
    moe = SMALL_DEEPSEEK
    last = 2 * b * s * 24 * 64
    assert F.block_recompute_flops(moe, b, s, "full") == F.block_flops_fwd(moe, b, s) - last


# ----------------------------------------------------------------------------- profile and estimate


@pytest.mark.parametrize(
    "model",
    ["deepseek-v3", "qwen3-30b-a3b", "validation/models/hf_configs/gpt-oss-120b.json", "llama3-8b"],
)
def test_profile_json_has_active_params_and_flops_per_token(model):
    result = runner.invoke(
        app,
        [
            "profile",
            str(ROOT / model) if model.endswith(".json") else model,
            "--seq",
            "4096",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    spec = catalog.get(model) if not model.endswith(".json") else catalog.get("gpt-oss-120b")
    assert doc["params"] == P.total_params(spec)
    assert doc["params_active"] == P.active_params(spec)
    assert doc["params_active_without_input_embedding"] == P.active_params(
        spec, input_embedding=False
    )
    assert doc["params_mtp"] == P.mtp_params(spec)
    assert doc["flops_per_token"] == pytest.approx(F.flops_per_token(spec, 4096))
    assert doc["model_flops"] == pytest.approx(doc["flops_per_token"] * 4096)
    assert sum(layer["params"] for layer in doc["layers"]) == doc["params"] + doc["params_mtp"]
    assert sum(layer["flops"]["forward"] for layer in doc["layers"]) == pytest.approx(
        doc["flops"]["forward"]
    )
    if spec.moe is not None:
        assert doc["model"]["moe"]["experts"] == spec.moe.experts
        assert doc["params_active"] < doc["params"]


def test_profile_rows_follow_the_block_kinds():
    doc = json.loads(runner.invoke(app, ["profile", "deepseek-v3", "--json"]).stdout)
    blocks = [layer for layer in doc["layers"] if layer["kind"] == "block"]
    assert len(blocks) == 61 and len({layer["params"] for layer in blocks[:3]}) == 1
    assert (
        blocks[0]["params"]
        == P.block_params(catalog.get("deepseek-v3").with_(moe=None))
        < blocks[3]["params"]
    )
    assert [layer["name"] for layer in doc["layers"] if layer["kind"] == "mtp"] == ["mtp.0"]


def test_profile_text_prints_total_active_and_flops_per_token():
    result = runner.invoke(app, ["profile", "mixtral-8x7b"])
    assert result.exit_code == 0, result.output
    assert (
        "46.7 G total, 12.9 G active per token (12.7 G without the input embedding)"
        in result.stdout
    )
    assert "training FLOPs per token at seq 4096" in result.stdout
    ds = runner.invoke(app, ["profile", "deepseek-v3"]).stdout
    assert (
        "671 G total" in ds
        and "36.6 G without the input embedding" in ds
        and "11.6 G more parameters" in ds
    )


def _estimate(model, gpus, dp, tp, pp, global_batch=512):
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig

    seq = 4096
    cfg = ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        global_batch=global_batch,
        micro_batch=1,
        zero=1,
        recompute="full",
        sequence_parallel=tp > 1,
        seq=seq,
        expert_tp=tp,
    )  # experts split like the MLP at ep = 1
    return estimate(model, "dgx-h100", cfg, gpus=gpus)


@pytest.mark.parametrize(
    "name,gpus,dp,tp,pp",
    [
        ("mixtral-8x7b", 64, 8, 2, 4),
        ("qwen3-30b-a3b", 16, 8, 1, 2),
        ("deepseek-v3", 1024, 8, 8, 16),
        ("gpt-oss-120b", 64, 16, 1, 4),
    ],
)
def test_estimate_runs_for_moe_models_at_ep_1(name, gpus, dp, tp, pp):
    result = _estimate(name, gpus, dp, tp, pp)
    spec = catalog.get(name)
    assert np.isfinite(result.step_time_s) and result.step_time_s > 0
    assert result.scores.model_flops_per_step == pytest.approx(
        F.model_flops_per_step(spec, 512 * 4096, causal_half=True)
    )
    ranks = result.memory_per_rank()
    assert len(ranks) == pp
    if name == "deepseek-v3":
        # 61 blocks over 16 ranks: 4, 4, ..., 3 on the last; the first rank's 3 dense blocks are ~20x smaller
        # than MoE blocks, the last rank holds the head and the 11.6B MTP module
        params = [r["params_bytes"] for r in ranks]
        bytes_per_param = params[1] / float(P.rank_params(spec, tp, 4, False, False))
        assert params[0] == pytest.approx(
            bytes_per_param * float(P.rank_params(spec, tp, 4, True, False)), rel=1e-6
        )
        assert params[0] < params[1] / 2
        assert params[-1] == pytest.approx(
            bytes_per_param * float(P.rank_params(spec, tp, 3, False, True)), rel=1e-6
        )
        assert params[-1] > params[1]


def test_estimate_of_an_moe_model_costs_its_experts():
    """At the same attention, top-8 of 128 experts takes longer than top-2 (expert GEMM work). Twice the
    experts at top-8: more memory (parameters), about the same FLOPs (only the router grows), but more
    time: each expert's weights serve half the rows (128 per expert at 4096 tokens), so the grouped GEMMs
    become bound by reading the weights (the roofline of cost_models.compute.gemm_seconds)."""
    base = catalog.get("qwen3-30b-a3b")
    k2 = _estimate(base.with_(moe=MoESpec(experts=128, top_k=2, expert_ffn=768)), 16, 8, 1, 2, 256)
    k8 = _estimate(base, 16, 8, 1, 2, 256)
    e256 = _estimate(
        base.with_(moe=MoESpec(experts=256, top_k=8, expert_ffn=768)), 16, 8, 1, 2, 256
    )
    assert k8.step_time_s > k2.step_time_s and k8.scores.compute[0] > 1.2 * k2.scores.compute[0]
    assert e256.peak_bytes_per_gpu > 1.5 * k8.peak_bytes_per_gpu
    assert e256.scores.model_flops_per_step == pytest.approx(
        k8.scores.model_flops_per_step, rel=0.01
    )
    assert e256.scores.compute[0] > 1.1 * k8.scores.compute[0]
