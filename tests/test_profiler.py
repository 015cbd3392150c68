"""Analytic profiler: formulas against the papers they cite, numpy arrays, and the profile JSON."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cost_models import activations as A
from cost_models import blocks as B
from cost_models import flops as F
from cost_models import params as P
from planner import catalog
from planner.cli import app
from planner.profiler import profile_model, profile_spec
from planner.run_options import RunOptions

runner = CliRunner()
GPT3 = catalog.get("gpt3-175b")


def test_gpt3_175b_model_flops_per_sequence_equal_flopcountermode_on_meta():
    """docs/executor-notes.md: FlopCounterMode on meta counts 2.2044e15 FLOPs for one 2048-token
    sequence of GPT-3 175B, forward + backward (6 N tokens + attention)."""
    assert F.model_flops_per_step(GPT3, 2048) == pytest.approx(2.2044e15, rel=1e-4)
    p = profile_spec(
        GPT3, micro_batch=1, options=RunOptions(attention="unfused")
    )  # math attention: backward = 2x forward everywhere
    assert p.flops_fwd + p.flops_bwd == pytest.approx(F.model_flops_per_step(GPT3, 2048), rel=1e-12)


def test_model_flops_equal_narayanan_eq3_with_72():
    """Narayanan et al. 2021 eq. 3 without recomputation: 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    for name in ("megatron-1t", "megatron-145b", "gpt3-175b"):
        s = catalog.get(name)
        B, seq, l, h, V = 8, s.seq, s.layers, s.hidden, s.vocab
        paper = 72 * B * seq * l * h * h * (1 + seq / (6 * h) + V / (12 * l * h))
        assert F.model_flops_per_step(s, B * seq) == pytest.approx(paper, rel=1e-12)


def test_korthikanti_table2_per_layer_activations():
    """Korthikanti et al. 2022 Table 2 (fp16, dropout, math attention) on fused kernels: sbh(34 + 5as/h)
    without parallelism, sbh(10 + 24/t + 5as/(ht)) with TP, sbh/t (34 + 5as/h) with TP+SP, selective
    sbh(34)/t with SP, full 2sbh."""
    s, b, h, a = GPT3.seq, 1, GPT3.hidden, GPT3.heads
    sbh = s * b * h
    table = B.block_table(GPT3, "amp-fp16", "fused", flash=False, dropout=True)
    assert A.block_bytes(table, b, s) == pytest.approx(sbh * (34 + 5 * a * s / h))
    for t in (2, 4, 8):
        assert A.block_bytes(table, b, s, tp=t) == pytest.approx(
            sbh * (10 + 24 / t + 5 * a * s / (h * t))
        )
        assert A.block_bytes(table, b, s, tp=t, sp=True) == pytest.approx(
            sbh / t * (34 + 5 * a * s / h)
        )
        assert A.block_bytes(table, b, s, tp=t, sp=True, recompute="selective") == pytest.approx(
            sbh / t * 34
        )
    assert A.block_bytes(table, b, s, recompute="full") == 2 * sbh


def test_torch_kernels_add_norm_statistics_and_flash_keeps_only_the_logsumexp():
    """Plain PyTorch modules (torch kernels, bf16): Korthikanti's 34 sbh less the two dropout masks, plus the
    LayerNorm statistics (2 x fp32 per token per norm); flash keeps the fp32 log-sum-exp per head, which
    selective recomputation drops."""
    table = B.block_table(GPT3, "bf16", "torch")
    s, h, a = GPT3.seq, GPT3.hidden, GPT3.heads
    none = A.block_bytes(table, 1, s)
    selective = A.block_bytes(table, 1, s, recompute="selective")
    assert none - selective == s * a * 4
    assert none == 32 * s * h + 16 * s + 4 * s * a


def test_cost_functions_accept_numpy_arrays_of_candidates():
    b = np.array([1, 2, 4, 8])
    tp = np.array([1, 2, 4, 8])
    sp = np.array([False, True, True, False])
    s = 2048
    table = B.block_table(GPT3, "amp-bf16", "fused")
    vec = A.block_bytes(table, b, s, tp=tp, sp=sp, recompute="selective")
    scalar = [
        A.block_bytes(table, int(bi), s, tp=int(ti), sp=bool(si), recompute="selective")
        for bi, ti, si in zip(b, tp, sp)
    ]
    np.testing.assert_allclose(vec, scalar)
    np.testing.assert_allclose(
        F.block_flops_fwd(GPT3, b, s), [F.block_flops_fwd(GPT3, int(x), s) for x in b]
    )
    np.testing.assert_allclose(
        A.block_bytes(table, b, s, tp=tp, recompute="full"), b * s * GPT3.hidden * 2
    )
    seqs = np.array([512, 1024, 2048])
    np.testing.assert_allclose(F.attention_core_flops_fwd(GPT3, 1, seqs), 4 * seqs**2 * GPT3.hidden)
    assert np.all(A.loss_bytes(GPT3, b, s, tp=tp) > 0)


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-70b", "llama2-7b", "t5-3b"])
def test_gemm_shapes_add_up_to_block_flops_and_tp_divides_them(name):
    spec = catalog.get(name)
    shapes = F.block_gemm_shapes(spec, 2, 1024)
    assert sum(g.flops for g in shapes) == pytest.approx(
        F.block_flops_fwd(spec, 2, 1024), rel=1e-12
    )
    sharded = F.block_gemm_shapes(spec, 2, 1024, tp=8)
    assert sum(g.flops for g in sharded) == pytest.approx(
        F.block_flops_fwd(spec, 2, 1024) / 8, rel=1e-12
    )


def test_full_recompute_costs_the_block_forward_less_its_last_gemm():
    """docs/executor-notes.md: non-reentrant checkpointing adds ~22% of total FLOPs, not a full forward."""
    b, s = 1, 2048
    extra = GPT3.layers * F.block_recompute_flops(GPT3, b, s, "full")
    total = F.model_flops_per_step(GPT3, b * s)
    assert 0.20 < extra / total < 0.23


def test_profile_json_follows_the_contract_and_totals_add_up():
    result = runner.invoke(
        app, ["profile", "llama3-8b", "--seq", "4096", "--micro-batch", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {"model", "params", "flops", "activations_bytes", "layers"} <= set(doc)
    assert {"forward", "backward"} <= set(doc["flops"]) and doc["params"] == 8_030_261_248
    assert doc["micro_batch"] == 2 and doc["seq"] == 4096 and len(doc["layers"]) == 32 + 3
    assert sum(layer["params"] for layer in doc["layers"]) == doc["params"]
    assert sum(layer["flops"]["forward"] for layer in doc["layers"]) == pytest.approx(
        doc["flops"]["forward"]
    )
    for mode in ("none", "selective", "full"):
        assert (
            sum(
                layer["activations_bytes"][mode]
                for layer in doc["layers"]
                if layer["kind"] != "loss"
            )
            == doc["activations_bytes"][mode]
        )  # the loss row is the logits transient
    # fused kernels with flash attention keep no s x s scores: selective (the checkpointed core attention) drops only
    # the kernel's fp32 log-sum-exp, 4 bytes per head per token (in 16 bits the projection keeps the output itself)
    lse = 32 * 4 * 32 * 2 * 4096
    assert doc["activations_bytes"]["none"] - doc["activations_bytes"]["selective"] == lse
    assert doc["activations_bytes"]["selective"] > doc["activations_bytes"]["full"]


def test_profile_table_is_human_readable():
    result = runner.invoke(app, ["profile", "gpt3-175b"])
    assert result.exit_code == 0 and "layers.0..95" in result.stdout and "175 G" in result.stdout


def test_precision_changes_activations_not_flops():
    fp32 = profile_model("llama2-7b", precision="fp32", framework="fsdp")
    amp = profile_model("llama2-7b", precision="amp-bf16", framework="fsdp")
    bf16 = profile_model("llama2-7b", precision="bf16", framework="fsdp")
    assert fp32.flops_fwd == amp.flops_fwd == bf16.flops_fwd
    assert fp32.activation_bytes() > amp.activation_bytes() > bf16.activation_bytes()
    result = runner.invoke(app, ["profile", "llama2-7b", "--precision", "fp4"])
    assert result.exit_code == 2 and "precision" in result.stderr


def test_every_catalog_model_profiles():
    for name in catalog.names():
        p = profile_model(name)
        assert p.params == P.total_params(catalog.get(name)) and p.flops_bwd > p.flops_fwd > 0
