"""The analytic profiler against a real forward+backward of planner.models.transformer on CPU:
FLOPs by torch.utils.flop_counter.FlopCounterMode (within 2%), activation bytes by what autograd
saves (torch.autograd.graph.saved_tensors_hooks, deduped by storage, parameters excluded; within
5%), for recompute none / selective (SDPA checkpointed) / full (blocks checkpointed)."""

import functools

import pytest
import torch

from planner.models.transformer import build_model, lm_loss
from planner.profiler import profile_spec
from tests.fixtures.torch_step import measure_step
from tests.fixtures.factories import SMALL_GPT, SMALL_LLAMA
from planner.run_options import RunOptions

MODES = ("none", "selective", "full")


def _small(model_type: str, **shape):
    """A two-block model of a Hugging Face family read from its released config (tests/fixtures/hf), shrunk."""
    from pathlib import Path

    from planner.hf_config import read_hf_config

    spec = read_hf_config(Path(__file__).parent / "fixtures" / "hf" / f"{model_type}.json")
    return spec.with_(layers=2, vocab=512, seq=64, **shape)


# Qwen3: QK-norm and an attention wider than the residual (head_dim x heads > hidden); Gemma: GeGLU with the tanh
# GELU, multi-query, head_dim x heads > hidden, tied; Phi-3: multi-head, untied (its 2047-token window is not
# shrunk here: the reference model masks a window where the analytic FLOPs assume a kernel that skips it)
SMALL_QWEN3 = _small("qwen3", hidden=128, heads=4, kv_heads=2, head_dim=64, ffn=256)
SMALL_GEMMA = _small("gemma", hidden=96, heads=2, kv_heads=1, head_dim=64, ffn=192)
SMALL_PHI3 = _small("phi3", hidden=128, heads=4, kv_heads=0, head_dim=0, ffn=256, sliding_window=0)


@functools.lru_cache(maxsize=None)
def measured_step(spec, dtype, mode, micro_batch=2):
    """FlopCounterMode total and saved bytes of one real training step (independent of planner's counter)."""
    return measure_step(spec, dtype, mode, micro_batch, exclude_buffers=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "spec",
    [SMALL_GPT, SMALL_LLAMA, SMALL_QWEN3, SMALL_GEMMA, SMALL_PHI3],
    ids=["gpt", "llama", "qwen3", "gemma", "phi3"],
)
@pytest.mark.parametrize(
    "dtype,precision", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")], ids=["fp32", "bf16"]
)
def test_analytic_matches_measured(spec, mode, dtype, precision):
    flops, saved_bytes = measured_step(spec, dtype, mode)
    # torch kernels; on CPU, SDPA's flash kernel accepts fp32 (on CUDA fp32 with GQA falls back to the math kernel)
    # the reference model's selective recompute checkpoints the attention core (Megatron's policy), not
    # torchtitan's per-operator one
    profile = profile_spec(
        spec,
        micro_batch=2,
        precision=precision,
        framework="torchtitan",
        selective="attention",
        options=RunOptions(attention="flash"),
    )
    analytic_flops = profile.flops_fwd + profile.flops_bwd + profile.recompute_flops(mode)
    assert analytic_flops == pytest.approx(flops, rel=0.02)
    # autograd also keeps the loss's fp32 log-softmax (the profile's loss row; the memory model counts
    # it with the logits transient)
    loss = next(layer.activation_bytes[mode] for layer in profile.layers if layer.kind == "loss")
    assert profile.activation_bytes(mode) + loss == pytest.approx(saved_bytes, rel=0.05)


def test_recompute_changes_memory_and_flops_in_the_expected_direction():
    results = {mode: measured_step(SMALL_LLAMA, torch.float32, mode) for mode in MODES}
    assert results["none"][0] < results["selective"][0] < results["full"][0]
    assert results["none"][1] > results["selective"][1] > results["full"][1]


def test_recompute_keeps_the_numbers():
    """Checkpointing changes memory, not results: same loss and gradients in every mode."""
    grads = {}
    for mode in MODES:
        model = build_model(SMALL_LLAMA).set_recompute(mode)
        tokens = torch.randint(
            0, SMALL_LLAMA.vocab, (2, SMALL_LLAMA.seq), generator=torch.Generator().manual_seed(1)
        )
        lm_loss(model(tokens), tokens).backward()
        grads[mode] = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.testing.assert_close(grads["selective"], grads["none"])
    torch.testing.assert_close(grads["full"], grads["none"])
    with pytest.raises(ValueError):
        build_model(SMALL_GPT).set_recompute("some")
