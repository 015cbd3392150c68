"""Training FLOPs of a transformer per micro-batch of b sequences of s tokens.

Counting convention (the one torch.utils.flop_counter.FlopCounterMode uses, so the two agree):
a GEMM of (m x k) by (k x n) costs 2 m n k FLOPs; elementwise work, softmax, norms and embedding
lookups cost nothing. Forward of a block is then (Narayanan et al. 2021, Sec. 5.1 / Appendix):

    F_block = 2 b s (4 h a d [= 4 h^2 for GPT] + 2 h f [3 h f gated])      (GEMMs, MHA; GQA shrinks K,V)
            + 4 b s^2 a d                                                  (QK^T and AV)

The attention core counts the full s x s square even for causal masks, as FlopCounterMode's
SDPA formulas and Megatron's papers do. Backward costs 2x forward for every GEMM (grad of the
input and of the weight). For the attention core, flash-style kernels recompute QK^T inside the
backward kernel, so FlopCounterMode counts 5 bmm there (2.5x forward); the math path counts 2x.

The model FLOPs of one step (used for MFU; Narayanan et al. 2021 eq. 3, with 72 in place of 96
because recomputation is not counted) are

    6 N tokens + 12 tokens s l a d        (N = GEMM weights incl. the LM head, cost_models.params.matmul_params)

which for GPT is 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
"""
from __future__ import annotations

from typing import NamedTuple

from cost_models import params as P
from planner.spec import TransformerSpec

ATTENTION_BWD_FACTOR_FLASH = 2.5
"""Flash/SDPA backward = QK^T recompute + dV, dP, dQ, dK: 5 bmm of the forward's 2 (torch's sdpa_backward_flop_count)."""
ATTENTION_BWD_FACTOR_MATH = 2.0
"""Math (unfused) attention backward: 2 bmm per forward bmm."""


class GemmShape(NamedTuple):
    """One GEMM of a block: `batch` independent (m x k) @ (k x n) products; FLOPs = 2 m n k batch."""

    name: str
    m: object
    n: object
    k: object
    batch: object = 1

    @property
    def flops(self):
        return 2 * self.m * self.n * self.k * self.batch


def block_gemm_shapes(spec: TransformerSpec, b, s, *, tp=1) -> list[GemmShape]:
    """The forward GEMMs of one (decoder) block with Megatron tensor parallelism over `tp` ranks
    (Shoeybi et al. 2019, Sec. 3: Q/K/V and W_1/W_3 split by columns, W_O and W_2 by rows, heads
    split across ranks). m = b s tokens; the sharded dimension is divided by tp. The attention
    core appears as two batched GEMMs over b a / tp heads. T5 decoders add the cross-attention's."""
    t = b * s
    h, f, d = spec.hidden, spec.d_ffn, spec.d_head
    shapes = [
        GemmShape("wq", t, spec.attn_width / tp, h),
        GemmShape("wk", t, spec.kv_width / tp, h),
        GemmShape("wv", t, spec.kv_width / tp, h),
        GemmShape("qk", s, s, d, b * spec.heads / tp),
        GemmShape("av", s, d, s, b * spec.heads / tp),
        GemmShape("wo", t, h, spec.attn_width / tp),
        GemmShape("w1", t, f / tp, h),
    ]
    if spec.gated_mlp:
        shapes.append(GemmShape("w3", t, f / tp, h))
    shapes.append(GemmShape("w2", t, h, f / tp))
    if spec.encoder_layers:
        shapes += [GemmShape("cross_" + g.name, g.m, g.n, g.k, g.batch) for g in shapes[:6]]
    return shapes


def block_matmul_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of a block's weight GEMMs: 2 b s x (GEMM weights of the block)."""
    return 2 * b * s * P.block_matmul_weights(spec)


def encoder_block_matmul_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of an encoder block's weight GEMMs (0 for decoder-only models)."""
    return 2 * b * s * P.encoder_block_matmul_weights(spec)


def attention_core_flops_fwd(spec: TransformerSpec, b, s):
    """QK^T and AV of one block: 2 x 2 b a s^2 d = 4 b s^2 a d (full square, causal or not, as
    FlopCounterMode counts it). T5 decoder blocks add the same again for cross-attention (encoder
    length taken equal to s)."""
    return 4 * b * s * s * spec.attn_width * (2 if spec.encoder_layers else 1)


def attention_core_flops_bwd(spec: TransformerSpec, b, s, *, flash: bool = True):
    """Backward of the attention core: 2.5x forward for flash/SDPA kernels (QK^T recomputed in the
    kernel, torch's sdpa_backward_flop_count), 2x for the math path."""
    factor = ATTENTION_BWD_FACTOR_FLASH if flash else ATTENTION_BWD_FACTOR_MATH
    return factor * attention_core_flops_fwd(spec, b, s)


def block_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of one (decoder) block: weight GEMMs + attention core."""
    return block_matmul_flops_fwd(spec, b, s) + attention_core_flops_fwd(spec, b, s)


def block_flops_bwd(spec: TransformerSpec, b, s, *, flash: bool = True):
    """Backward FLOPs of one block without recomputation: 2x the GEMMs + the attention core's backward."""
    return 2 * block_matmul_flops_fwd(spec, b, s) + attention_core_flops_bwd(spec, b, s, flash=flash)


def encoder_block_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of one encoder block (self-attention only); 0 for decoder-only models."""
    enc = 1 if spec.encoder_layers else 0
    return encoder_block_matmul_flops_fwd(spec, b, s) + enc * 4 * b * s * s * spec.attn_width


def head_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of the output side: logits 2 b s h V (+ BERT's MLM transform 2 b s h^2)."""
    return 2 * b * s * P.head_matmul_weights(spec)


def block_recompute_flops(spec: TransformerSpec, b, s, recompute: str, *, flash: bool = True,
                          early_stop: bool = True):
    """Extra forward FLOPs per block spent in the backward pass by activation recomputation.

    - none: 0.
    - selective (Korthikanti et al. 2022, Sec. 5: checkpoint the attention core only): the core's
      forward (4 b s^2 a d) is run again.
    - full (checkpoint every block): the block's forward again, minus its last GEMM (W_2) when
      non-reentrant checkpointing stops recomputing once every saved tensor is back
      (torch.utils.checkpoint early stop; docs/executor-notes.md measured +22% rather than +33%).
      `early_stop=False` gives Megatron's reentrant full forward.
    """
    if recompute == "none":
        return 0 * b * s
    if recompute == "selective":
        return attention_core_flops_fwd(spec, b, s)
    if recompute == "full":
        last_gemm = 2 * b * s * spec.d_ffn * spec.hidden if early_stop else 0
        return block_flops_fwd(spec, b, s) - last_gemm
    raise ValueError(f"recompute must be none, selective or full, not {recompute!r}")


def model_flops_per_step(spec: TransformerSpec, tokens, *, seq=None):
    """Model FLOPs of one training step over `tokens` tokens (sequences of `seq`, default the
    spec's): 6 N tokens + 3 x (attention core forward), recomputation not counted. This is the
    numerator of MFU (PaLM, Chowdhery et al. 2022, App. B; Narayanan et al. 2021 eq. 3 with 72)."""
    s = spec.seq if seq is None else seq
    sequences = tokens / s
    attention = 3 * (spec.layers * attention_core_flops_fwd(spec, sequences, s)
                     + spec.encoder_layers * 4 * sequences * s * s * spec.attn_width)
    return 6 * P.matmul_params(spec) * tokens + attention
