"""Parameter counts of a `TransformerSpec`, component by component.

Exact counts of the layout the spec describes (the reference model in planner/models/transformer.py
for decoder-only models; Hugging Face layouts for BERT and T5). With GPT-style biases and two
LayerNorms this reduces to Narayanan et al. 2021, Sec. 5.1 (eq. 2):

    P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))

where 12h^2 = 4h^2 (Q, K, V, O) + 8h^2 (MLP of 4h) and 13h = biases (3h + h + 4h + h) + two
LayerNorms (4h). The paper's count leaves out the final LayerNorm (2h); ours includes it.

Symbols: h hidden, a heads, k kv_heads, d d_head, f d_ffn, V vocab, l layers.
All functions return Python ints (the spec is never an array).
"""
from __future__ import annotations

from planner.spec import TransformerSpec


def norm_params(spec: TransformerSpec) -> int:
    """One normalization layer: LayerNorm has weight and bias (2h), RMSNorm weight only (h)."""
    return 2 * spec.hidden if spec.norm == "layernorm" else spec.hidden


def attention_weight_params(spec: TransformerSpec) -> int:
    """GEMM weights of one attention: W_Q (h x a d), W_K and W_V (h x k d each), W_O (a d x h)."""
    h = spec.hidden
    return h * spec.attn_width + 2 * h * spec.kv_width + spec.attn_width * h


def attention_params(spec: TransformerSpec) -> int:
    """Attention weights plus biases: Q/K/V biases (a d + 2 k d) if qkv_bias, O bias (h) if out_bias."""
    bias = (spec.attn_width + 2 * spec.kv_width) * spec.qkv_bias + spec.hidden * spec.out_bias
    return attention_weight_params(spec) + bias


def mlp_weight_params(spec: TransformerSpec) -> int:
    """GEMM weights of the MLP: W_1 (h x f), W_2 (f x h), and W_3 (h x f) when gated (SwiGLU)."""
    return (3 if spec.gated_mlp else 2) * spec.hidden * spec.d_ffn


def mlp_params(spec: TransformerSpec) -> int:
    """MLP weights plus biases (f per up/gate matrix, h for the down matrix) if mlp_bias."""
    n_up = 2 if spec.gated_mlp else 1
    return mlp_weight_params(spec) + (n_up * spec.d_ffn + spec.hidden) * spec.mlp_bias


def cross_attention_params(spec: TransformerSpec) -> int:
    """Encoder-decoder (T5) decoder blocks: a second attention over the encoder output and its norm."""
    return (attention_params(spec) + norm_params(spec)) if spec.encoder_layers else 0


def block_params(spec: TransformerSpec) -> int:
    """One (decoder) block: attention + MLP + `norms_per_block` norms (+ cross-attention for T5)."""
    return (attention_params(spec) + mlp_params(spec) + spec.norms_per_block * norm_params(spec)
            + cross_attention_params(spec))


def encoder_block_params(spec: TransformerSpec) -> int:
    """One encoder block of an encoder-decoder model (no cross-attention); 0 when there is none."""
    if not spec.encoder_layers:
        return 0
    return attention_params(spec) + mlp_params(spec) + spec.norms_per_block * norm_params(spec)


def embedding_params(spec: TransformerSpec) -> int:
    """Input side: token table V h, learned positions n_pos h, token types (BERT), an embedding norm
    (BLOOM, BERT), and T5's relative position bias (buckets x a per stack, encoder and decoder)."""
    h = spec.hidden
    relative = spec.relative_buckets * spec.heads * (2 if spec.encoder_layers else 1)
    return (spec.vocab * h + spec.n_positions * h + spec.type_vocab * h
            + norm_params(spec) * spec.embed_norm + relative * (spec.position == "relative"))


def final_norm_params(spec: TransformerSpec) -> int:
    """The norm after the last block (one per stack for encoder-decoder models)."""
    stacks = 2 if spec.encoder_layers else 1
    return norm_params(spec) * stacks * spec.final_norm


def head_params(spec: TransformerSpec) -> int:
    """Output side: the LM head V h (0 when tied to the token table), BERT's MLM transform
    (h^2 + h + norm) and vocabulary bias V, and BERT's pooler (h^2 + h)."""
    h = spec.hidden
    lm = 0 if spec.tied_embeddings else spec.vocab * h
    mlm = (h * h + h + norm_params(spec) + spec.vocab) * spec.mlm_head
    pooler = (h * h + h) * spec.pooler
    return lm + mlm + pooler


def total_params(spec: TransformerSpec) -> int:
    """All parameters, each shared tensor counted once."""
    return (embedding_params(spec) + spec.layers * block_params(spec)
            + spec.encoder_layers * encoder_block_params(spec) + final_norm_params(spec) + head_params(spec))


def block_matmul_weights(spec: TransformerSpec) -> int:
    """Weights a token multiplies in one (decoder) block: attention + MLP GEMM weights, plus
    cross-attention's for T5 decoders. Each contributes 2 FLOPs per token forward."""
    cross = attention_weight_params(spec) if spec.encoder_layers else 0
    return attention_weight_params(spec) + mlp_weight_params(spec) + cross


def encoder_block_matmul_weights(spec: TransformerSpec) -> int:
    """GEMM weights of one encoder block (0 for decoder-only models)."""
    return (attention_weight_params(spec) + mlp_weight_params(spec)) if spec.encoder_layers else 0


def head_matmul_weights(spec: TransformerSpec) -> int:
    """Weights of the output GEMMs per token: the logits V h (tied or not) plus BERT's MLM transform."""
    return spec.vocab * spec.hidden + spec.hidden * spec.hidden * spec.mlm_head


def matmul_params(spec: TransformerSpec) -> int:
    """N of the '6 N tokens' rule: weights used in GEMMs per token (blocks and LM head; not the
    embedding lookup, biases, norms or positions). For GPT-style models this is 12 l h^2 + V h,
    the count behind Narayanan et al. 2021 eq. 3."""
    return (spec.layers * block_matmul_weights(spec) + spec.encoder_layers * encoder_block_matmul_weights(spec)
            + head_matmul_weights(spec))


def rank_params(spec: TransformerSpec, tp, n_blocks, is_first, is_last):
    """Parameters one tensor-parallel rank of a pipeline rank holds: its blocks, the embedding on the
    first rank, the final norm and head on the last, and a second copy of a tied embedding on a last
    rank that is not also the first (Megatron's embedding group, Shoeybi et al. 2019); / tp. Arrays
    broadcast."""
    import numpy as np

    tied_copy = spec.vocab * spec.hidden if spec.tied_embeddings else 0
    return (n_blocks * block_params(spec) + np.where(is_first, embedding_params(spec), 0.0)
            + np.where(is_last, head_params(spec) + final_norm_params(spec), 0.0)
            + np.where(is_last & ~np.asarray(is_first), tied_copy, 0.0)) / np.asarray(tp, dtype=float)
