"""The reference MoE / MLA model (planner.models.transformer) against the analytic profile on CPU: FLOPs by
torch.utils.flop_counter.FlopCounterMode exactly, saved-for-backward bytes (saved_tensors_hooks) within
1% (5% with full recompute, as for dense models), parameters exactly; and what the routing does."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from cost_models import params as P
from planner.models.transformer import MoEFeedForward, _masked_core, build_model
from planner.profiler import profile_spec
from planner.spec import MoESpec
from tests.fixtures.torch_step import measure_step
from tests.fixtures.factories import SMALL_DEEPSEEK, SMALL_DEEPSEEK_MLA_UNEQUAL, SMALL_MIXTRAL
from planner.run_options import RunOptions

MODES = ("none", "selective", "full")


@functools.lru_cache(maxsize=None)
def measured_step(spec, dtype, mode, micro_batch=2):
    """FlopCounterMode total and saved bytes (parameters and buffers excluded) of one training step."""
    return measure_step(spec, dtype, mode, micro_batch)


@pytest.mark.parametrize(
    "spec,mode",
    [pytest.param(SMALL_MIXTRAL, m, id=f"mixtral-{m}") for m in MODES]
    + [
        # ~5 s each: the slow tier; DeepSeek's full recomputation (which re-runs every part) stays
        pytest.param(
            SMALL_DEEPSEEK, m, id=f"deepseek-{m}", marks=[pytest.mark.slow] * (m != "full")
        )
        for m in MODES
    ],
)
def test_analytic_flops_equal_flop_counter(spec, mode):
    """Router, dropless top-k experts (each multiplies exactly its rows), shared expert, the dense first
    block, MLA's projections and core, recomputation (early stop skips the shared experts' W_2)."""
    flops, _ = measured_step(spec, torch.float32, mode)
    profile = profile_spec(
        spec,
        micro_batch=2,
        precision="fp32",
        framework="torchtitan",
        options=RunOptions(attention="flash"),
    )
    assert profile.flops_fwd + profile.flops_bwd + profile.recompute_flops(mode) == flops


@pytest.mark.parametrize("mode", ["none", "full"])
def test_mla_with_unequal_head_widths_on_the_math_kernel(mode):
    """d_qk 24 != d_v 12 (as DeepSeek-V3's 192 / 128): CPU SDPA takes its math path, whose backward is 2x
    the forward (attention='unfused'); a flash kernel's would be 2 b s^2 a (3 d_qk + 2 d_v)."""
    flops, _ = measured_step(SMALL_DEEPSEEK_MLA_UNEQUAL, torch.float32, mode)
    profile = profile_spec(
        SMALL_DEEPSEEK_MLA_UNEQUAL,
        micro_batch=2,
        precision="fp32",
        framework="torchtitan",
        options=RunOptions(attention="unfused"),
    )
    assert profile.flops_fwd + profile.flops_bwd + profile.recompute_flops(mode) == flops


@pytest.mark.parametrize(
    "mode,dtype,precision",
    [(m, torch.float32, "fp32") for m in MODES] + [("none", torch.bfloat16, "bf16")],
    ids=[*MODES, "none-bf16"],
)
@pytest.mark.parametrize("spec", [SMALL_MIXTRAL, SMALL_DEEPSEEK], ids=["mixtral", "deepseek"])
def test_analytic_activation_bytes_match_what_autograd_saves(spec, mode, dtype, precision):
    _, saved = measured_step(spec, dtype, mode)
    profile = profile_spec(
        spec,
        micro_batch=2,
        precision=precision,
        framework="torchtitan",
        options=RunOptions(attention="flash"),
    )
    # the loss's fp32 log-softmax is the profile's loss row (the memory model counts it with the logits)
    loss = next(layer.activation_bytes[mode] for layer in profile.layers if layer.kind == "loss")
    assert profile.activation_bytes(mode) + loss == pytest.approx(
        saved, rel=0.05 if mode == "full" else 0.01
    )


@pytest.mark.parametrize("spec", [SMALL_MIXTRAL, SMALL_DEEPSEEK, SMALL_DEEPSEEK_MLA_UNEQUAL])
def test_reference_parameters_are_the_spec_count(spec):
    model = build_model(spec, device="meta", seed=None)
    assert sum(p.numel() for p in model.parameters()) == P.total_params(spec)


def test_expert_modules_are_named_for_sharding():
    names = {n for n, _ in build_model(SMALL_DEEPSEEK, device="meta", seed=None).named_parameters()}
    assert "layers.0.feed_forward.w1.weight" in names  # the dense first block
    assert {f"layers.1.feed_forward.experts.{e}.w1.weight" for e in range(8)} <= names
    assert {
        "layers.1.feed_forward.router.weight",
        "layers.1.feed_forward.shared_experts.w2.weight",
        "layers.1.attention.wq_a.weight",
        "layers.1.attention.wkv_b.weight",
    } <= names


def _moe(**changes) -> MoEFeedForward:
    moe = MoESpec(**({"experts": 8, "top_k": 2, "expert_ffn": 16} | changes))
    torch.manual_seed(0)
    layer = MoEFeedForward(SMALL_MIXTRAL.with_(moe=moe))
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.2)
    return layer


def test_routing_is_dropless_top_k():
    layer, x = _moe(), torch.randn(50, 64)
    index, weight = layer.route(x)
    assert index.shape == (50, 2) and torch.all(index[:, 0] != index[:, 1])
    torch.testing.assert_close(weight.sum(-1), torch.ones(50))
    probs = layer.router(x).softmax(-1)
    torch.testing.assert_close(probs.gather(1, index), probs.topk(2).values)  # the k best experts
    counts = torch.bincount(index.flatten(), minlength=8)
    assert int(counts.sum()) == 50 * 2


def test_moe_output_is_the_weighted_sum_of_its_experts():
    """With every expert chosen (top_k = E) the block is Σ_e softmax_e(x W_r) expert_e(x), computed densely."""
    layer, x = _moe(top_k=8), torch.randn(20, 64)
    probs = layer.router(x).softmax(-1)
    dense = sum(probs[:, e, None] * layer.experts[e](x) for e in range(8))
    torch.testing.assert_close(layer(x), dense, rtol=1e-5, atol=1e-5)


def test_group_limited_sigmoid_routing():
    """DeepSeek-V3: experts of at most `groups_per_token` groups, sigmoid scores renormalized and scaled."""
    layer = _moe(
        router="sigmoid",
        expert_groups=4,
        groups_per_token=2,
        top_k=3,
        routed_scaling=2.5,
        aux_free_bias=True,
    )
    x = torch.randn(200, 64)
    index, weight = layer.route(x)
    groups = index // 2
    assert max(len(set(row.tolist())) for row in groups) <= 2
    torch.testing.assert_close(weight.sum(-1), torch.full((200,), 2.5))
    layer.expert_bias[5] = 100.0  # the balancing bias steers the choice, not the weights
    index, weight = layer.route(x)
    assert torch.all((index == 5).any(-1))
    scores = layer.router(x).sigmoid()
    torch.testing.assert_close(
        weight, 2.5 * scores.gather(1, index) / scores.gather(1, index).sum(-1, keepdim=True)
    )


def test_sinks_and_windows_in_the_masked_core():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(
        _masked_core(q, k, v, causal=True, window=16, sinks=None, gqa=False), causal
    )
    quiet = torch.full((4,), -1e4)
    torch.testing.assert_close(
        _masked_core(q, k, v, causal=True, window=0, sinks=quiet, gqa=False), causal
    )
    loud = torch.full((4,), 1e4)
    assert _masked_core(q, k, v, causal=True, window=0, sinks=loud, gqa=False).abs().max() < 1e-3
    banded = _masked_core(q, k, v, causal=True, window=1, sinks=None, gqa=False)
    torch.testing.assert_close(banded, v)  # a window of one key: each query sees itself only
