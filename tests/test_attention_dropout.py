"""Dropout on the attention probabilities inside a fused kernel: each pass runs at the fraction of
its no-dropout rate measured on GB200 for cuDNN's fused attention and FlashAttention-4 (forward
75-85%, backward 60-70% of the TFLOP/s without dropout; Dao-AILab/flash-attention pull request
2597), and a whole step pays exactly that on its attention time and nothing else."""

from __future__ import annotations

import pytest

from cost_models.compute import flash_attention_seconds
from hardware_profiles import load_profile
from planner.catalog import get
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.run_options import RunOptions

MEASURED_FWD = (0.75, 0.85)
MEASURED_BWD = (0.60, 0.70)
"""The source's ranges of the with-dropout rate over the without-dropout one."""


def _kernel(dropout: bool):
    hw = load_profile("gb200-nvl72")
    return flash_attention_seconds(
        1, 8192, 16, 128, causal=True, hw=hw, precision="amp-bf16", kernel="fused", dropout=dropout
    ), hw


def test_each_pass_runs_at_the_measured_share_of_its_rate():
    (fwd, bwd), hw = _kernel(False)
    (fwd_d, bwd_d), _ = _kernel(True)
    fixed = hw.efficiency["gemm_fixed_us"] * 1e-6  # the launch's fixed cost is not a rate
    fwd_rate, bwd_rate = (fwd - fixed) / (fwd_d - fixed), (bwd - fixed) / (bwd_d - fixed)
    assert MEASURED_FWD[0] <= fwd_rate <= MEASURED_FWD[1]
    assert MEASURED_BWD[0] <= bwd_rate <= MEASURED_BWD[1]


def test_a_step_with_dropout_pays_it_on_the_attention_kernels_only():
    spec, hw = get("llama3-8b"), load_profile("p5.48xlarge")
    cfg = ParallelConfig(
        dp=8, tp=1, pp=1, micro_batch=1, global_batch=8, seq=8192, framework="megatron"
    )
    attention = RunOptions(attention="fused")
    plain = estimate(spec, hw, cfg, gpus=8, options=attention)
    dropped = estimate(spec, hw, cfg, gpus=8, options=attention.with_(dropout=True))
    kw = dict(causal=True, hw=hw, precision=cfg.precision, kernel="fused")
    fwd, bwd = flash_attention_seconds(1, 8192, spec.heads, spec.d_head, **kw)
    fwd_d, bwd_d = flash_attention_seconds(1, 8192, spec.heads, spec.d_head, dropout=True, **kw)
    kernels_s = spec.layers * ((fwd_d - fwd) + (bwd_d - bwd))
    extra_s = dropped.time_breakdown_s()["compute"] - plain.time_breakdown_s()["compute"]
    assert kernels_s > 0
    # the rest of dropout (the residual masks' bytes) is memory traffic, a few percent of it
    assert extra_s == pytest.approx(kernels_s, rel=0.05)


def test_fp32s_memory_efficient_kernel_keeps_its_rate():
    # its matmuls share the CUDA cores with the random numbers, and its efficiency was fitted on
    # steps that ran dropout (cost_models.compute.DROPOUT_SLOWED_KERNELS)
    hw = load_profile("p5.48xlarge")
    kw = dict(causal=True, hw=hw, precision="fp32", kernel="mem_efficient")
    assert flash_attention_seconds(1, 2048, 16, 64, dropout=True, **kw) == (
        flash_attention_seconds(1, 2048, 16, 64, **kw)
    )


def test_only_the_attention_probabilities_dropout_slows_the_kernel():
    """OPT's config drops its residuals (dropout 0.1) but not its attention probabilities
    (attention_dropout 0.0): the kernel keeps its rate; GPT-2's attn_pdrop 0.1 slows it, and a
    config that does not say (Megatron's defaults drop both) follows the run's dropout."""
    from cost_models.compute import attention_dropout
    from planner.hf_config import training_defaults

    opt = get("llama3-8b").with_(extras=training_defaults({"dropout": 0.1, "attention_dropout": 0}))
    gpt2 = get("llama3-8b").with_(extras=training_defaults({"resid_pdrop": 0.1, "attn_pdrop": 0.1}))
    assert dict(opt.extras)["dropout"] == 0.1
    assert not attention_dropout(True, opt)
    assert attention_dropout(True, gpt2) and not attention_dropout(False, gpt2)
    assert attention_dropout(True, get("llama3-8b"))


def test_the_triton_kernel_takes_no_dropout():
    # llm-foundry's Triton FlashAttention raises on dropout: a run with it drops nothing there
    hw = load_profile("p4d.24xlarge")
    kw = dict(causal=True, hw=hw, precision="amp-bf16", kernel="triton")
    assert flash_attention_seconds(1, 2048, 16, 128, dropout=True, **kw) == (
        flash_attention_seconds(1, 2048, 16, 128, **kw)
    )
