"""Parameter counts of a `TransformerSpec`, component by component.

Exact counts of the layout the spec describes (the reference model in planner/models/transformer.py
for decoder-only models; Hugging Face layouts for BERT and T5). With GPT-style biases and two
LayerNorms this reduces to Narayanan et al. 2021, Sec. 5.1 (eq. 2):

    P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))

where 12h^2 = 4h^2 (Q, K, V, O) + 8h^2 (MLP of 4h) and 13h = biases (3h + h + 4h + h) + two
LayerNorms (4h). The paper's count leaves out the final LayerNorm (2h); ours includes it.

Symbols: h hidden, a heads, k kv_heads, d d_head, f d_ffn, V vocab, l layers.
All functions return Python ints (the spec is never an array).

Mixture-of-experts models (planner.spec.MoESpec; docs/models.md): a block's MLP is E routed experts
(each an MLP of width f_e), S shared experts of width f_s, a router (E h, + E with a bias) and, for
Qwen2-MoE, a shared-expert gate (h). `block_*` functions describe the repeating block (the MoE block of
an MoE model); the leading dense blocks (first_dense_layers) enter the model totals through
`TransformerSpec.block_kinds` and the first pipeline rank through `rank_params`. Multi-head latent
attention (MLASpec) replaces Q/K/V/O by its low-rank projections.

Two counts per model, as the publishers define them (validation/models/README.md):
- `total_params`: every stored weight of the main model once (DeepSeek-V3's 671B: without the MTP
  module, which `mtp_params` counts);
- `active_params`: the weights one token touches: attention, norms, router, its top-k routed experts
  and the shared ones, the output head, and (input_embedding=True, Mistral's and Qwen's convention)
  the input embedding table; OpenAI (gpt-oss 5.13B) and DeepSeek (36.6B of README_WEIGHTS) leave the
  input embedding out (input_embedding=False).
"""

from __future__ import annotations

from planner.spec import TransformerSpec


def norm_params(spec: TransformerSpec) -> int:
    """One normalization layer: LayerNorm has weight and bias (2h), RMSNorm weight only (h)."""
    return 2 * spec.hidden if spec.norm == "layernorm" else spec.hidden


def mla_projection_weights(spec: TransformerSpec) -> dict[str, int]:
    """MLA's GEMM weights by projection (MLASpec; DeepSeek-V3 report Sec. 2.1.1, eq. 1-11):
    q_a h r_q and q_b r_q a (d_n + d_r) (or q h a (d_n + d_r) without a query latent), kv_a h (r_kv + d_r),
    kv_b r_kv a (d_n + d_v), o a d_v h."""
    m, h, a = spec.mla, spec.hidden, spec.heads
    out = (
        {"q_a": h * m.q_lora_rank, "q_b": m.q_lora_rank * a * m.qk_head_dim}
        if m.q_lora_rank
        else {"q": h * a * m.qk_head_dim}
    )
    out |= {
        "kv_a": h * (m.kv_lora_rank + m.qk_rope_head_dim),
        "kv_b": m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim),
        "o": a * m.v_head_dim * h,
    }
    return out


def attention_weight_params(spec: TransformerSpec) -> int:
    """GEMM weights of one attention: W_Q (h x a d), W_K and W_V (h x k d each), W_O (a d x h); MLA's
    projections (mla_projection_weights) for an MLA model."""
    if spec.mla is not None:
        return sum(mla_projection_weights(spec).values())
    h = spec.hidden
    return h * spec.attn_width + 2 * h * spec.kv_width + spec.attn_width * h


def attention_params(spec: TransformerSpec) -> int:
    """Attention weights plus biases: Q/K/V biases (a d + 2 k d) if qkv_bias, O bias (h) if out_bias;
    gpt-oss's sinks (a); Qwen3's QK-norm (2 d, RMSNorm weights). MLA: biases on its input projections
    (q_a r_q or q a d, kv_a r_kv + d_r) if qkv_bias, and the norms of the query and key/value latents."""
    extra = (
        spec.heads * spec.attention_sinks
        + 2 * spec.d_head * spec.qk_norm
        + spec.hidden * spec.out_bias
    )
    if spec.mla is not None:
        m = spec.mla
        q_in = m.q_lora_rank or spec.heads * m.qk_head_dim
        bias = (q_in + m.kv_lora_rank + m.qk_rope_head_dim) * spec.qkv_bias
        per_width = norm_params(spec) // spec.hidden
        latent_norms = per_width * (m.q_lora_rank + m.kv_lora_rank)
        return attention_weight_params(spec) + bias + latent_norms + extra
    bias = (spec.attn_width + 2 * spec.kv_width) * spec.qkv_bias
    return attention_weight_params(spec) + bias + extra


def ffn_weight_params(spec: TransformerSpec, width: int) -> int:
    """GEMM weights of one MLP of inner width `width`: W_1 (h x f), W_2 (f x h), and W_3 (h x f)
    when gated (SwiGLU). A routed or shared expert is such an MLP."""
    return (3 if spec.gated_mlp else 2) * spec.hidden * width


def largest_module_params(spec: TransformerSpec) -> int:
    """Weights of the largest single linear module of one block, what a per-module ZeRO-3 gather brings in at
    once (DeepSpeed's hooks fetch a module's own parameters): the fused QKV projection (h x (a d + 2 k d)), the
    output projection, the MLP's up projection (gate and up fused, 2 h f, when gated, as Megatron builds it)
    or its down projection (f h); an MoE block's largest expert or shared-expert projection; MLA's largest
    projection."""
    h = spec.hidden
    if spec.mla is not None:
        attn = max(mla_projection_weights(spec).values())
    else:
        attn = max(h * (spec.attn_width + 2 * spec.kv_width), spec.attn_width * h)
    widths = (
        [spec.d_ffn]
        if spec.moe is None
        else [spec.moe.expert_ffn, spec.moe.d_shared_ffn * (spec.moe.shared_experts > 0)]
    )
    up = 2 if spec.gated_mlp else 1
    return int(max(attn, *(max(up * h * w, w * h) for w in widths)))


def ffn_params(spec: TransformerSpec, width: int) -> int:
    """One MLP of inner width `width` with its biases (f per up/gate matrix, h for the down matrix)
    if mlp_bias."""
    n_up = 2 if spec.gated_mlp else 1
    return ffn_weight_params(spec, width) + (n_up * width + spec.hidden) * spec.mlp_bias


def router_params(spec: TransformerSpec) -> int:
    """Router of an MoE block: E h (+ E bias, gpt-oss), plus Qwen2-MoE's shared-expert gate h. DeepSeek-
    V3's balancing bias is a buffer updated by a rule (MoESpec.aux_free_bias), not counted."""
    moe = spec.moe
    return (
        moe.experts * spec.hidden
        + moe.experts * moe.router_bias
        + spec.hidden * moe.shared_expert_gate
    )


def mlp_weight_params(spec: TransformerSpec) -> int:
    """GEMM weights of the MLP: W_1 (h x f), W_2 (f x h), and W_3 (h x f) when gated (SwiGLU); for
    an MoE block every expert, the shared experts and the router (and gate) weights."""
    if spec.moe is None:
        return ffn_weight_params(spec, spec.d_ffn)
    moe = spec.moe
    return (
        moe.experts * ffn_weight_params(spec, moe.expert_ffn)
        + moe.shared_experts * ffn_weight_params(spec, moe.d_shared_ffn)
        + moe.experts * spec.hidden
        + spec.hidden * moe.shared_expert_gate
    )


def mlp_params(spec: TransformerSpec) -> int:
    """MLP weights plus biases (f per up/gate matrix, h for the down matrix) if mlp_bias; for an MoE
    block E routed experts + S shared experts (each with the same biases) + the router."""
    if spec.moe is None:
        return ffn_params(spec, spec.d_ffn)
    moe = spec.moe
    return (
        moe.experts * ffn_params(spec, moe.expert_ffn)
        + moe.shared_experts * ffn_params(spec, moe.d_shared_ffn)
        + router_params(spec)
    )


def mlp_active_params(spec: TransformerSpec) -> int:
    """The MLP weights one token uses: the whole MLP, or the router, its k routed experts and the
    shared experts of an MoE block."""
    if spec.moe is None:
        return mlp_params(spec)
    moe = spec.moe
    return (
        moe.top_k * ffn_params(spec, moe.expert_ffn)
        + moe.shared_experts * ffn_params(spec, moe.d_shared_ffn)
        + router_params(spec)
    )


def mlp_matmul_weights(spec: TransformerSpec) -> int:
    """GEMM weights one token multiplies in the MLP: all of a dense MLP; for an MoE block the router
    (E h), its k routed experts, the S shared experts and the shared-expert gate (h)."""
    if spec.moe is None:
        return mlp_weight_params(spec)
    moe = spec.moe
    return (
        moe.experts * spec.hidden
        + moe.top_k * ffn_weight_params(spec, moe.expert_ffn)
        + moe.shared_experts * ffn_weight_params(spec, moe.d_shared_ffn)
        + spec.hidden * moe.shared_expert_gate
    )


def cross_attention_params(spec: TransformerSpec) -> int:
    """Encoder-decoder (T5) decoder blocks: a second attention over the encoder output and its norm."""
    return (attention_params(spec) + norm_params(spec)) if spec.encoder_layers else 0


def block_params(spec: TransformerSpec) -> int:
    """One (decoder) block: attention + MLP + `norms_per_block` norms (+ cross-attention for T5)."""
    return (
        attention_params(spec)
        + mlp_params(spec)
        + spec.norms_per_block * norm_params(spec)
        + cross_attention_params(spec)
    )


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
    return (
        spec.vocab * h
        + spec.n_positions * h
        + spec.type_vocab * h
        + norm_params(spec) * spec.embed_norm
        + relative * (spec.position == "relative")
    )


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


def blocks_params(spec: TransformerSpec) -> int:
    """Parameters of all (decoder) blocks: the sum over the kinds of block (TransformerSpec.block_kinds:
    an MoE model's leading dense blocks differ from its MoE blocks)."""
    return sum(len(kind.layers) * block_params(kind.spec) for kind in spec.block_kinds)


def total_params(spec: TransformerSpec) -> int:
    """All parameters of the main model, each shared tensor counted once (MTP modules apart:
    mtp_params)."""
    return (
        embedding_params(spec)
        + blocks_params(spec)
        + spec.encoder_layers * encoder_block_params(spec)
        + final_norm_params(spec)
        + head_params(spec)
    )


def mtp_module_params(spec: TransformerSpec) -> int:
    """One multi-token-prediction module without the embedding and output head it shares with the
    model (DeepSeek-V3 report Sec. 2.2, Fig. 3): a block of the model's last kind, RMSNorms of the
    hidden state and of the next token's embedding (2 h), their 2h x h projection and the norm before
    the shared head (h)."""
    return block_params(spec.last_kind) + 3 * norm_params(spec) + 2 * spec.hidden * spec.hidden


def mtp_params(spec: TransformerSpec) -> int:
    """Unique parameters of all MTP modules (DeepSeek-V3 README_WEIGHTS: 11.5B for its one module);
    0 for models without them."""
    return spec.mtp_modules * mtp_module_params(spec)


def block_active_params(spec: TransformerSpec) -> int:
    """Parameters one token touches in a block: attention, norms, and mlp_active_params."""
    cross = cross_attention_params(spec)
    return (
        attention_params(spec)
        + mlp_active_params(spec)
        + spec.norms_per_block * norm_params(spec)
        + cross
    )


def active_params(spec: TransformerSpec, *, input_embedding: bool = True) -> int:
    """Parameters one token touches in the main model (MTP apart): every block's attention, norms,
    router, top-k routed and shared experts (block_active_params), the final norm and the output head,
    and with `input_embedding` the input embedding table (and position/token-type tables). Equal to
    total_params for dense models with input_embedding=True. Publishers' definitions (module
    docstring): Mixtral, Qwen input_embedding=True; gpt-oss, DeepSeek-V3 False."""
    blocks = sum(len(kind.layers) * block_active_params(kind.spec) for kind in spec.block_kinds)
    encoder = spec.encoder_layers * encoder_block_params(spec)
    embedding = embedding_params(spec) if input_embedding else 0
    tied_head = spec.vocab * spec.hidden if spec.tied_embeddings and not input_embedding else 0
    return embedding + blocks + encoder + final_norm_params(spec) + head_params(spec) + tied_head


def block_matmul_weights(spec: TransformerSpec) -> int:
    """Weights a token multiplies in one (decoder) block: attention + MLP GEMM weights (for an MoE
    block the router, top-k routed and shared experts: mlp_matmul_weights), plus cross-attention's
    for T5 decoders. Each contributes 2 FLOPs per token forward."""
    cross = attention_weight_params(spec) if spec.encoder_layers else 0
    return attention_weight_params(spec) + mlp_matmul_weights(spec) + cross


def block_stored_matmul_weights(spec: TransformerSpec) -> int:
    """GEMM weights a block stores (every expert of an MoE block): what an autocast weight cache or a
    gathered ZeRO-3 block holds."""
    cross = attention_weight_params(spec) if spec.encoder_layers else 0
    return attention_weight_params(spec) + mlp_weight_params(spec) + cross


def block_small_params(spec: TransformerSpec) -> int:
    """A block's parameters that are not GEMM weights (block_params less
    block_stored_matmul_weights): its norms and biases."""
    return block_params(spec) - block_stored_matmul_weights(spec)


def encoder_block_matmul_weights(spec: TransformerSpec) -> int:
    """GEMM weights of one encoder block (0 for decoder-only models)."""
    return (attention_weight_params(spec) + mlp_weight_params(spec)) if spec.encoder_layers else 0


def head_matmul_weights(spec: TransformerSpec) -> int:
    """Weights of the output GEMMs per token: the logits V h (tied or not) plus BERT's MLM transform."""
    return spec.vocab * spec.hidden + spec.hidden * spec.hidden * spec.mlm_head


def matmul_params(spec: TransformerSpec) -> int:
    """N of the '6 N tokens' rule: weights used in GEMMs per token (blocks and LM head; not the
    embedding lookup, biases, norms or positions). For GPT-style models this is 12 l h^2 + V h,
    the count behind Narayanan et al. 2021 eq. 3. For MoE models it is the active N: router, top-k
    routed and shared experts (block_matmul_weights), summed over the kinds of block; MTP apart
    (mtp_matmul_params)."""
    blocks = sum(len(kind.layers) * block_matmul_weights(kind.spec) for kind in spec.block_kinds)
    return (
        blocks
        + spec.encoder_layers * encoder_block_matmul_weights(spec)
        + head_matmul_weights(spec)
    )


def mtp_matmul_params(spec: TransformerSpec) -> int:
    """GEMM weights one token multiplies in the MTP modules: per module its block (active), the 2h x h
    projection and the shared output head V h (DeepSeek-V3 report Sec. 2.2)."""
    per_module = (
        block_matmul_weights(spec.last_kind)
        + 2 * spec.hidden * spec.hidden
        + head_matmul_weights(spec)
    )
    return spec.mtp_modules * per_module


def dense_prefix_blocks(spec: TransformerSpec) -> int:
    """Leading dense blocks of an MoE model (MoESpec.first_dense_layers); 0 otherwise."""
    return spec.moe.first_dense_layers if spec.moe is not None else 0


def dense_prefix_params(spec: TransformerSpec) -> int:
    """Parameters of one leading dense block of an MoE model (its MLP has the dense width ffn)."""
    return block_params(spec.with_(moe=None)) if spec.moe is not None else 0


def rank_params(spec: TransformerSpec, tp, n_blocks, is_first, is_last):
    """Parameters one tensor-parallel rank of a pipeline rank holds: its blocks, the embedding on the
    first rank, the final norm and head (and MTP modules, which Megatron-Core places after the last
    block) on the last, and a second copy of a tied embedding on a last rank that is not also the
    first (Megatron's embedding group, Shoeybi et al. 2019); / tp. The blocks are the repeating block
    (block_params), except that the first rank's first min(first_dense_layers, n) blocks are an MoE
    model's leading dense blocks (they lead the first chunk whenever it has that many blocks). Arrays
    broadcast."""
    import numpy as np

    dense = np.where(is_first, np.minimum(dense_prefix_blocks(spec), n_blocks), 0.0)
    prefix = (
        dense * (dense_prefix_params(spec) - block_params(spec))
        if dense_prefix_blocks(spec)
        else 0.0
    )
    return (
        n_blocks * block_params(spec)
        + prefix
        + np.where(is_last, mtp_params(spec), 0.0)
        + _edge_params(spec, is_first, is_last)
    ) / np.asarray(tp, dtype=float)


def edge_params(spec: TransformerSpec, tp, is_first, is_last):
    """Of rank_params, what lies outside the blocks and MTP modules: the embedding on the first
    rank, the final norm and head on the last, a tied embedding's second copy; / tp. FP8 recipes
    keep these in 16 bits (cost_models.comm._gathered_bytes)."""
    import numpy as np

    return _edge_params(spec, is_first, is_last) / np.asarray(tp, dtype=float)


def _edge_params(spec: TransformerSpec, is_first, is_last):
    import numpy as np

    tied_copy = spec.vocab * spec.hidden if spec.tied_embeddings else 0
    return (
        np.where(is_first, embedding_params(spec), 0.0)
        + np.where(is_last, head_params(spec) + final_norm_params(spec), 0.0)
        + np.where(is_last & ~np.asarray(is_first), tied_copy, 0.0)
    )
