"""Attention efficiency by sequence length, head dim and causality (cost_models.compute.attention_efficiency)
against the published kernel benchmarks vendored in validation/kernels/attention.json (Dao 2023,
FlashAttention-2 Fig. 4-7; Shah et al. 2024, FlashAttention-3 Fig. 5-7), and the invariants a user relies on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from cost_models.compute import attention_efficiency
from hardware_profiles import load_profile

DATA = json.loads(
    (Path(__file__).resolve().parents[1] / "validation" / "kernels" / "attention.json").read_text()
)
PEAK = {"H100": 989.4, "A100": 312.0}
FIGURES = ("fa2-readme-a100", "fa2-readme-h100", "fa3-readme-h100")
"""The FlashAttention authors' benchmark figures (the curves the efficiency was read from)."""


def _points(kernel, gpu, passes, sources=FIGURES):
    out = []
    for r in DATA["measurements"]:
        if (
            r["source_id"] in sources
            and r["kernel"] == kernel
            and r["gpu"].startswith(gpu)
            and r["pass"] in passes
            and r["tflops"] is not None
        ):
            out.append((r["seq"], r["head_dim"], r["causal"], r["tflops"] / PEAK[gpu]))
    return out


@pytest.mark.parametrize(
    "kernel,gpu,profile,model_kernel,passes,tolerance",
    [
        ("flash_attention_2", "H100", "dgx-h100", "flash", ("fwd_bwd",), 0.15),
        ("flash_attention_2", "A100", "dgx-a100-80g", "flash", ("fwd_bwd",), 0.15),
        # the Triton kernel shares FlashAttention-2's curve shape scaled (ATTENTION_RELATIVE); its non-causal
        # rate sits further above its causal one than the shared shape says: within 25%, causal within 14%
        ("flash_attention_triton", "A100", "dgx-a100-80g", "triton", ("fwd_bwd",), 0.25),
    ],
)
def test_the_curve_reproduces_the_published_benchmarks(
    kernel, gpu, profile, model_kernel, passes, tolerance
):
    hw = load_profile(profile)
    # the published Triton curve (FA2's README) is the typed table's default rate; the profiles hold
    # llm-foundry's fork fitted to its runs (benchmarks/calibrate_frameworks.py)
    hw = dataclasses.replace(
        hw, efficiency={k: v for k, v in hw.efficiency.items() if k != "triton_attention_relative"}
    )
    points = _points(kernel, gpu, passes)
    assert len(points) >= 20
    errors = [
        attention_efficiency(hw, model_kernel, s, d, causal=c) / e - 1
        for s, d, c, e in points
        if d in (64, 128)
    ]
    assert np.median(np.abs(errors)) <= tolerance / 2 and max(np.abs(errors)) <= 2 * tolerance, (
        errors
    )


def test_fused_kernel_matches_fa3_and_cudnn_within_their_backward():
    # FA3 / cuDNN forward is measured; forward + backward efficiency (the model's) sits below the forward's
    hw = load_profile("dgx-h100")
    for s, d, c, e in _points("flash_attention_3", "H100", ("fwd",)) + _points(
        "cudnn", "H100", ("fwd",)
    ):
        if d == 128 and s >= 2048:
            assert 0.7 * e <= attention_efficiency(hw, "fused", s, d, causal=c) <= e


def _te_example(source, kernel, seq) -> dict:
    (row,) = (
        r
        for r in DATA["measurements"]
        if (r["source_id"], r["kernel"], r["seq"]) == (source, kernel, seq)
    )
    return row


def test_forward_and_backward_at_8k_is_transformer_engines_measurement():
    # TE's own example (TE 1.10, cuDNN 9.3, flash-attn 2.4.2 on an H100 SXM; a short benchmark, so
    # at the boost clock): the fused key was read off forward-only figures and a backward ratio,
    # this is a forward + backward measurement it was not set from. At 2k with 32 (batch x heads)
    # the kernels run 25-35% below the curve (fewer tiles than the figures' 16k tokens per call).
    hw = load_profile("dgx-h100")
    for kernel, model_kernel in (("cudnn", "fused"), ("flash_attention_2", "flash")):
        measured = _te_example("te-attention-example-h100", kernel, 8192)["fraction_of_dense_peak"]
        modelled = attention_efficiency(hw, model_kernel, 8192, 128, causal=True)
        assert abs(modelled / measured - 1) <= 0.03, (kernel, modelled, measured)


@pytest.mark.parametrize(
    "source,seq",
    [
        ("te-attention-example-h100", 2048),
        ("te-attention-example-h100", 8192),
        ("te-attention-example-h100-pcie", 8192),
    ],
)
def test_cudnn_over_flash_attention_2_is_the_measured_ratio(source, seq):
    # cuDNN 9.3 (SXM) runs 1.59-1.60x flash-attn 2.4.2 at 2k and 8k, cuDNN 9.0 (PCIe) 1.59x at 8k,
    # which the fused over flash keys reproduce: long-sequence runs of the cuDNN 9.0 era take the
    # same fused rate. At 2k cuDNN 9.0 ran 1.38x (13% below), a short-sequence gap not modelled.
    hw = load_profile("dgx-h100")
    measured = (
        _te_example(source, "cudnn", seq)["tflops"]
        / _te_example(source, "flash_attention_2", seq)["tflops"]
    )
    modelled = attention_efficiency(hw, "fused", seq, 128, causal=True) / attention_efficiency(
        hw, "flash", seq, 128, causal=True
    )
    assert abs(modelled / measured - 1) <= 0.03, (modelled, measured)


def test_the_fitted_triton_fork_is_faster_than_the_tutorial_kernel_and_slower_than_fa2():
    hw = load_profile("dgx-a100-80g")
    tutorial = dataclasses.replace(
        hw, efficiency={k: v for k, v in hw.efficiency.items() if k != "triton_attention_relative"}
    )
    for s in (2048, 16384):
        fork = attention_efficiency(hw, "triton", s, 128, causal=True)
        assert (
            attention_efficiency(tutorial, "triton", s, 128, causal=True)
            < fork
            < attention_efficiency(hw, "flash", s, 128, causal=True)
        )


def test_efficiency_grows_with_sequence_and_stays_below_its_maximum():
    hw = load_profile("dgx-h100")
    s = np.array([256, 512, 1024, 4096, 16384, 131072])
    for kernel in ("fused", "flash"):
        for causal in (True, False):
            e = attention_efficiency(hw, kernel, s, 128, causal=causal)
            assert (
                np.all(np.diff(e) > 0)
                and e[-1]
                < hw.efficiency[
                    "fused_attention_efficiency"
                    if kernel == "fused"
                    else "flash_attention_efficiency"
                ]
            )
        assert np.all(
            attention_efficiency(hw, kernel, s, 128, causal=True)
            < attention_efficiency(hw, kernel, s, 128, causal=False)
        )
