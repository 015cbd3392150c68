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

Mixture-of-experts, MLA and windowed models (docs/models.md):
- a token multiplies the router (E h), its k routed experts and the shared experts (dropless:
  Σ over experts of their rows = t k exactly); with a capacity factor C every expert computes its
  padded buffer of C t k / E rows, so the routed GEMMs cost C times as much (GShard, Switch);
- MLA multiplies its low-rank projections (cost_models.params.mla_projection_weights) and its core
  has query/key heads of d_qk = nope + rope and value heads of d_v: forward 2 b s^2 a (d_qk + d_v),
  flash backward 2 b s^2 a (3 d_qk + 2 d_v) (torch's sdpa_backward_flop_count);
- a windowed block (sliding_window) scores each query against min(w, s) keys, the band a windowed
  kernel computes, instead of s;
- `block_*` functions describe the repeating block (the MoE block; averaged over the kinds of an
  alternating window pattern, TransformerSpec.block_mix); model totals sum over the kinds;
- model FLOPs use the active N (router + top-k routed + shared experts) and add the MTP modules
  (DeepSeek-V3: one block, its 2h x h projection and the shared head's logits per module), which
  training runs: 6 N_active tokens + 3 x attention, as Megatron-LM's num_floating_point_operations
  counts MoE models (without its causal halving of the core).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cost_models import params as P
from cost_models.blocks import op_sac
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


def keys_per_query(spec: TransformerSpec, s):
    """Keys each query is scored against in a block of uniform `spec`: s, or min(w, s) when the
    block attends through a sliding window of w tokens."""
    return np.minimum(spec.sliding_window, s) if spec.windowed(0) else s


def _core_gemms(spec: TransformerSpec, b, s, tp, share=1.0) -> list[GemmShape]:
    """QK^T and AV of a uniform block as batched GEMMs over b a / tp heads (x `share` of the blocks)."""
    kv = keys_per_query(spec, s)
    heads = b * spec.heads / tp * share
    return [GemmShape("qk", s, kv, spec.d_head, heads), GemmShape("av", s, spec.d_value, kv, heads)]


def _mlp_gemms(
    spec: TransformerSpec, t, tp, width, prefix: str, rows=None, experts=1
) -> list[GemmShape]:
    """W_1 (and W_3 when gated) by columns, W_2 by rows, of `experts` MLPs of width `width` with
    `rows` rows each (default t)."""
    m = t if rows is None else rows
    out = [GemmShape(prefix + "w1", m, width / tp, spec.hidden, experts)]
    if spec.gated_mlp:
        out.append(GemmShape(prefix + "w3", m, width / tp, spec.hidden, experts))
    return out + [GemmShape(prefix + "w2", m, spec.hidden, width / tp, experts)]


def expert_rows(spec: TransformerSpec, tokens):
    """Rows one routed expert multiplies, on average over a balanced router: t k / E dropless, the
    padded capacity C t k / E with a capacity factor (Fedus et al. 2021, Switch, Sec. 2.2). Small
    per-expert GEMMs run far below the large-GEMM rate (the roofline of cost_models.compute)."""
    moe = spec.moe
    return tokens * moe.top_k / moe.experts * (moe.capacity_factor or 1.0)


ATTENTION_CORE_GEMMS = ("qk", "av")
"""block_gemm_shapes' names of the attention core's two batched GEMMs (scores and their
product with the values); the others are the linear layers' GEMMs."""


def block_gemm_shapes(spec: TransformerSpec, b, s, *, tp=1) -> list[GemmShape]:
    """The forward GEMMs of one (decoder) block with Megatron tensor parallelism over `tp` ranks
    (Shoeybi et al. 2019, Sec. 3: Q/K/V and W_1/W_3 split by columns, W_O and W_2 by rows, heads
    split across ranks). m = b s tokens; the sharded dimension is divided by tp. The attention
    core appears as two batched GEMMs over b a / tp heads. T5 decoders add the cross-attention's.

    MoE block (Megatron-Core MoE, expert tensor parallelism = tp, ep = 1): the router (t x E x h,
    replicated), the routed experts as grouped GEMMs, one group of E experts of expert_rows = t k / E
    rows each (batch E), and the shared experts as one MLP of width S f_s (Megatron's
    moe_shared_expert_intermediate_size) and Qwen2-MoE's gate (t x 1 x h). MLA: the down
    projections q_a and kv_a are replicated (Megatron-Core's MLA), q_b, kv_b and o split by heads.
    A windowed block's QK^T and AV span min(w, s) keys; a model whose blocks alternate full and
    windowed attention lists the core GEMMs of each kind with its share of the blocks in `batch`."""
    t = b * s
    h = spec.hidden
    if spec.mla is not None:
        m = spec.mla
        a = spec.heads / tp
        q = (
            [
                GemmShape("wq_a", t, m.q_lora_rank, h),
                GemmShape("wq_b", t, a * m.qk_head_dim, m.q_lora_rank),
            ]
            if m.q_lora_rank
            else [GemmShape("wq", t, a * m.qk_head_dim, h)]
        )
        shapes = q + [
            GemmShape("wkv_a", t, m.kv_lora_rank + m.qk_rope_head_dim, h),
            GemmShape("wkv_b", t, a * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
        ]
    else:
        shapes = [
            GemmShape("wq", t, spec.attn_width / tp, h),
            GemmShape("wk", t, spec.kv_width / tp, h),
            GemmShape("wv", t, spec.kv_width / tp, h),
        ]
    for share, kind in spec.block_mix:
        shapes += _core_gemms(kind, b, s, tp, share)
    shapes.append(GemmShape("wo", t, h, spec.heads * spec.d_value / tp))
    if spec.moe is None:
        shapes += _mlp_gemms(spec, t, tp, spec.d_ffn, "")
    else:
        moe = spec.moe
        shapes.append(GemmShape("router", t, moe.experts, h))
        shapes += _mlp_gemms(
            spec, t, tp, moe.expert_ffn, "experts_", rows=expert_rows(spec, t), experts=moe.experts
        )
        if moe.shared_experts:
            shapes += _mlp_gemms(spec, t, tp, moe.shared_experts * moe.d_shared_ffn, "shared_")
        if moe.shared_expert_gate:
            shapes.append(GemmShape("shared_gate", t, 1, h))
    if spec.encoder_layers:
        shapes += [GemmShape("cross_" + g.name, g.m, g.n, g.k, g.batch) for g in shapes[:6]]
    return shapes


def block_matmul_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of a block's weight GEMMs: 2 b s x (GEMM weights of the block; the active ones of
    an MoE block, routed experts x capacity_factor when tokens are padded to capacity)."""
    padding = 0
    if spec.moe is not None and spec.moe.capacity_factor is not None:
        padding = (
            (spec.moe.capacity_factor - 1.0)
            * spec.moe.top_k
            * P.ffn_weight_params(spec, spec.moe.expert_ffn)
        )
    return 2 * b * s * (P.block_matmul_weights(spec) + padding)


def encoder_block_matmul_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of an encoder block's weight GEMMs (0 for decoder-only models)."""
    return 2 * b * s * P.encoder_block_matmul_weights(spec)


def _uniform_core_fwd(spec: TransformerSpec, b, s):
    if spec.mla is None and not spec.sliding_window:
        return 4 * b * s * s * spec.attn_width * (2 if spec.encoder_layers else 1)
    return 2 * b * s * keys_per_query(spec, s) * spec.heads * (spec.d_head + spec.d_value)


def attention_core_flops_fwd(spec: TransformerSpec, b, s):
    """QK^T and AV of one block: 2 x 2 b a s^2 d = 4 b s^2 a d (full square, causal or not, as
    FlopCounterMode counts it). T5 decoder blocks add the same again for cross-attention (encoder
    length taken equal to s). In general 2 b s n a (d_qk + d_v) with n = s keys per query, or
    min(w, s) in a windowed block; d_qk != d_v for MLA. The mean over the repeating kinds of a model
    whose blocks alternate windowed and full attention (TransformerSpec.block_mix)."""
    if len(spec.block_mix) == 1:
        return _uniform_core_fwd(spec, b, s)
    return sum(share * _uniform_core_fwd(kind, b, s) for share, kind in spec.block_mix)


def attention_core_flops_bwd(spec: TransformerSpec, b, s, *, flash: bool = True):
    """Backward of the attention core: 2.5x forward for flash/SDPA kernels (QK^T recomputed in the
    kernel, torch's sdpa_backward_flop_count: 2 b s n a (3 d_qk + 2 d_v), so 2.6x for DeepSeek-V3's
    MLA), 2x for the math path."""
    if not flash:
        return ATTENTION_BWD_FACTOR_MATH * attention_core_flops_fwd(spec, b, s)
    if spec.mla is None:
        return ATTENTION_BWD_FACTOR_FLASH * attention_core_flops_fwd(spec, b, s)
    return (
        (3 * spec.d_head + 2 * spec.d_value)
        / (spec.d_head + spec.d_value)
        * attention_core_flops_fwd(spec, b, s)
    )


def attention_kernel_flops_fwd(spec: TransformerSpec, b, s):
    """FLOPs a fused causal attention kernel really does in one block's forward (what its time
    follows, cost_models.compute.flash_attention_seconds): it skips fully masked tiles, so a causal
    block does half the square, 2 b a s^2 (d_qk + d_v) / 2; a windowed block the band,
    2 b a (s n - n^2 / 2) (d_qk + d_v) with n = min(w, s); a bidirectional block the square."""

    def uniform(kind):
        n = keys_per_query(kind, s)
        pairs = (s * n - n * n / 2.0) if kind.causal else s * n
        return 2.0 * b * pairs * kind.heads * (kind.d_head + kind.d_value)

    return sum(share * uniform(kind) for share, kind in spec.block_mix)


def block_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of one (decoder) block: weight GEMMs + attention core."""
    return block_matmul_flops_fwd(spec, b, s) + attention_core_flops_fwd(spec, b, s)


def block_flops_bwd(spec: TransformerSpec, b, s, *, flash: bool = True):
    """Backward FLOPs of one block without recomputation: 2x the GEMMs + the attention core's backward."""
    return 2 * block_matmul_flops_fwd(spec, b, s) + attention_core_flops_bwd(
        spec, b, s, flash=flash
    )


def encoder_block_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of one encoder block (self-attention only); 0 for decoder-only models."""
    enc = 1 if spec.encoder_layers else 0
    return encoder_block_matmul_flops_fwd(spec, b, s) + enc * 4 * b * s * s * spec.attn_width


def head_flops_fwd(spec: TransformerSpec, b, s):
    """Forward FLOPs of the output side: logits 2 b s h V (+ BERT's MLM transform 2 b s h^2)."""
    return 2 * b * s * P.head_matmul_weights(spec)


def block_recompute_flops(
    spec: TransformerSpec,
    b,
    s,
    recompute: str,
    *,
    flash: bool = True,
    early_stop: bool = True,
    selective: str = "attention",
):
    """Extra forward FLOPs per block spent in the backward pass by activation recomputation.

    - none: 0.
    - selective (Korthikanti et al. 2022, Sec. 5: checkpoint the attention core only): the core's
      forward (4 b s^2 a d) is run again; `selective='op'` (torchtitan's per-operator policy,
      cost_models.blocks.op_sac): the linear layers it did not save.
    - full (checkpoint every block): the block's forward again, minus its last GEMM (W_2) when
      non-reentrant checkpointing stops recomputing once every saved tensor is back
      (torch.utils.checkpoint early stop; docs/executor-notes.md measured +22% rather than +33%).
      `early_stop=False` gives Megatron's reentrant full forward.
    """
    if recompute == "none":
        return 0 * b * s
    if recompute == "selective" and selective == "op" and spec.moe is None and spec.mla is None:
        # torchtitan: the matmuls its policy did not save
        linear = sum(
            2.0 * g.m * g.n * g.k * g.batch
            for g in block_gemm_shapes(spec, b, s)
            if g.name not in ATTENTION_CORE_GEMMS
        )
        return op_sac(spec, "amp-bf16", "torch").gemm_fraction * linear
    if recompute == "selective":
        return attention_core_flops_fwd(spec, b, s)
    if recompute == "full":
        return block_flops_fwd(spec, b, s) - (_last_gemm_flops(spec, b, s) if early_stop else 0)
    raise ValueError(f"recompute must be none, selective or full, not {recompute!r}")


def _last_gemm_flops(spec: TransformerSpec, b, s):
    """The block's last GEMM, whose output nothing saves, so that early-stopping recomputation skips
    it: W_2 of a dense MLP, of the shared experts of an MoE block (computed after the routed ones in
    planner.models.transformer), none without shared experts (the routed W_2 outputs are saved by the
    gate-weighting product)."""
    if spec.moe is None:
        return 2 * b * s * spec.d_ffn * spec.hidden
    return 2 * b * s * spec.moe.shared_experts * spec.moe.d_shared_ffn * spec.hidden


def model_flops_per_step(spec: TransformerSpec, tokens, *, seq=None, causal_half: bool = False):
    """Model FLOPs of one training step over `tokens` tokens (sequences of `seq`, default the
    spec's): 6 N tokens + 3 x (attention core forward), recomputation not counted. This is the
    numerator of MFU (PaLM, Chowdhery et al. 2022, App. B; Narayanan et al. 2021 eq. 3 with 72).
    N is the active GEMM weights of an MoE model (cost_models.params.matmul_params), the attention
    sums over the kinds of block (windowed ones count their window), and MTP modules add their
    GEMMs (params.mtp_matmul_params) and attention cores. `causal_half` counts half of every causal
    core, as Megatron-LM's num_floating_point_operations does (and Megatron-Bridge's and NeMo
    AutoModel's reported TFLOP/s; tests/test_moe_flops.py reproduces them)."""
    s = spec.seq if seq is None else seq
    sequences = tokens / s
    blocks = sum(
        len(kind.layers) * _uniform_core_fwd(kind.spec, sequences, s) for kind in spec.block_kinds
    )
    mtp = (
        spec.mtp_modules * _uniform_core_fwd(spec.last_kind, sequences, s)
        if spec.mtp_modules
        else 0
    )
    decoder = (blocks + mtp) * (0.5 if causal_half and spec.causal else 1.0)
    attention = 3 * (decoder + spec.encoder_layers * 4 * sequences * s * s * spec.attn_width)
    return 6 * (P.matmul_params(spec) + P.mtp_matmul_params(spec)) * tokens + attention


def flops_per_token(spec: TransformerSpec, seq=None):
    """Training FLOPs per token at sequence length `seq` (default the spec's): model_flops_per_step
    of one sequence / s = 6 N_active + 3 x the attention cores' forward per token (+ MTP)."""
    s = spec.seq if seq is None else seq
    return model_flops_per_step(spec, s, seq=s) / s
