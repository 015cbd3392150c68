"""Memory per rank at its peak (torch.cuda.max_memory_allocated semantics), numbers or numpy arrays.

Model states per parameter (bytes), by precision and implementation:

    eager amp (PyTorch autocast): fp32 params 4 + fp32 grads 4 + Adam m, v 8 = 16, plus the
        autocast cache of bf16 copies of every GEMM weight (2 bytes each) during the forward;
    megatron amp (fp16/bf16 mixed precision, Megatron's theoretical_memory_usage.py): 2-byte
        params + 4-byte main grads + fp32 master, m, v 12 = 18;
    fp32: 4 + 4 + 8 = 16;  pure bf16 (states in bf16, as torch.optim.AdamW keeps them): 2 + 2 + 4 = 8.
    SGD with momentum keeps one state instead of two.

ZeRO (Rajbhandari et al. 2020, Sec. 5): stage 1 shards the optimizer states over dp, stage 2 also
the gradients, stage 3 also the parameters (plus the gathered parameters of the block in use and
the one prefetched).

The peak is the largest of three moments of a step (each a sum over what is alive then):
  forward end     states (+ grads when they persist: grad accumulation, Megatron's grad buffer)
                  + autocast weight cache + saved activations + logits of the forward;
  backward start  as above with the loss's backward transient (logits peak);
  backward end    states + all grads + the transient of the last gradient (the tied embedding's
                  dense gradient, V h) — the peak of small-activation runs.
Plus the framework's workspaces (cuBLAS: one per stream that runs GEMMs, forward and autograd
threads), which the caching allocator counts.
"""
from __future__ import annotations

import numpy as np



def state_bytes_per_param(precision: str, optimizer: str, impl: str) -> tuple[float, float, float]:
    """(params, grads, optimizer states) bytes per parameter (see module docstring)."""
    n_states = 2.0 if optimizer == "adamw" else 1.0
    if precision == "bf16":
        return 2.0, 2.0, 2.0 * n_states
    if precision == "fp32" or impl == "eager":
        return 4.0, 4.0, 4.0 * n_states
    return 2.0, 4.0, 4.0 + 4.0 * n_states      # megatron mixed precision: fp32 master + states


def zero_sharded(bytes_, dp, zero, from_stage: int):
    """Bytes on one rank when ZeRO stage >= `from_stage` shards them over dp."""
    return np.where(np.asarray(zero) >= from_stage, bytes_ / np.asarray(dp, dtype=float), bytes_)


def grads_persist(impl: str, num_microbatches):
    """Whether gradients exist during the forward: always with Megatron's contiguous grad buffer,
    otherwise when micro-batches accumulate into them (set_to_none zero_grad frees them per step)."""
    m = np.asarray(num_microbatches, dtype=float)
    return np.ones_like(m, dtype=bool) if impl == "megatron" else m > 1


def peak_bytes(*, params, grads, optimizer, grads_present, cache_fwd, cache_bwd, activations,
               logits_fwd_end, logits_peak, last_grad_transient, recompute_transient, workspace):
    """Largest of the three moments; returns (peak, activations term, other term) of that moment."""
    states = params + optimizer
    g_fwd = np.where(grads_present, grads, 0.0)
    fwd_end = states + g_fwd + cache_fwd + activations + logits_fwd_end + workspace
    bwd_start = states + g_fwd + cache_bwd + activations + np.maximum(logits_peak, recompute_transient) + workspace
    bwd_end = states + grads + last_grad_transient + workspace
    peak = np.maximum(np.maximum(fwd_end, bwd_start), bwd_end)
    acts = np.where(peak == bwd_end, 0.0, activations)
    other = peak - states - np.where(peak == bwd_end, grads, g_fwd) - acts
    return peak, acts, other


ALLOCATOR_OVERHEAD_FRACTION = 0.05
"""Caching-allocator blocks beyond the tensors they hold (reserved / allocated - 1): median 0.052 over
the 42 H100 steps of validation/h100_train_steps.jsonl (range 0.003-0.20); efficiency key
`allocator_overhead_fraction`."""
def allocator_overhead_fraction(hw) -> float:
    return ALLOCATOR_OVERHEAD_FRACTION


def cuda_context_bytes(hw) -> float:
    """CUDA context, kernels and library handles outside the caching allocator (efficiency key)."""
    from hardware_profiles.efficiency import efficiency
    return efficiency(hw, "cuda_context_bytes")
