"""Bytes of activations saved for the backward pass, per micro-batch of b sequences of s tokens.

Starting point: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4.1 and Table 2. For one GPT layer in fp16 with dropout, no parallelism:

    sbh (34 + 5 a s / h)   bytes
      = attention 11 sbh + 5 a s^2 b   (QKV input 2, Q K 4, softmax 2as^2b, its dropout mask as^2b and
                                        output 2as^2b, V 2, W_O input 2, dropout mask 1)
      + MLP 19 sbh                      (input 2, GELU input 8, GELU output 8, dropout mask 1)
      + two LayerNorm inputs 4 sbh.
    tensor parallel t, no SP: sbh (10 + 24/t + 5as/(ht));   with SP: sbh/t (34 + 5as/h)
    selective recompute drops the 5as/h term; full recompute keeps only the block input 2sbh.

Adapted here to what planner/models/transformer.py (and Hugging Face's SDPA models) really save,
term by term (measured with torch.autograd.graph.saved_tensors_hooks, tests/test_profiler_torch.py):

    norm_inputs      n_norm * t h * r      each norm saves its input (the residual stream, dtype r);
                                           RMSNorm computes in fp32 (torch's rms_norm and HF's LlamaRMSNorm
                                           upcast 16-bit inputs), so it saves an fp32 copy: t h * 4
    norm_normalized  n_norm * t h * 4      RMSNorm also saves the fp32 x * rstd for the weight grad
    norm_stats       n_norm * t * 4 * (2 LayerNorm: mean, rstd | 1 RMSNorm: rstd)   fp32
    norm_outputs     n_norm * t h * c      the norm output = input of the next GEMM, in compute dtype c
    dropout_masks    2 t h * 1             residual dropouts (only if dropout)
    qkv              t (a d + 2 k d) * c   Q, K, V saved by attention; GQA keeps K, V at k heads
                                           (SDPA with enable_gqa, no repeat_interleave copy)
    attn_out         t a d * c             attention output, also W_O's input (one storage)
    attn_core        flash: t a * 4        logsumexp (fp32) kept by flash/SDPA kernels
                     math:  t a s * c      softmax output (+ dropout mask t a s and output t a s c)
    mlp              2 t f * c             GELU input and output (W_2 input); gated (SwiGLU): 4 t f c
                                           (W_1 out, W_3 out, act out, product = W_2 input)
with t = b s tokens, c = bytes_per_elem (compute dtype), r = residual_bytes_per_elem (fp32 under
autocast, as the residual stream stays fp32). The first five terms are replicated across tensor
parallel ranks unless sequence parallelism shards them (Korthikanti Sec. 4.2.2); the others are
split over tp (heads and f are split).

Recompute modes: "none" keeps everything; "selective" drops `attn_core` (the checkpointed core's
inputs Q, K, V and output are saved anyway); "full" keeps the block input t h r only (divided by tp
with SP, as Megatron stores it sharded).
"""
from __future__ import annotations

from planner.spec import TransformerSpec

PRECISION_BYTES = {"fp32": (4, 4), "amp-bf16": (2, 4), "amp-fp16": (2, 4), "bf16": (2, 2), "fp8": (2, 4)}
"""precision -> (compute bytes per element c, residual-stream bytes per element r). Under autocast
(amp-*) GEMM outputs are 16-bit but the residual stream and norms stay fp32."""

RECOMPUTE_MODES = ("none", "selective", "full")


def precision_bytes(precision: str) -> tuple[int, int]:
    """(compute, residual) bytes per element for a contract precision name."""
    try:
        return PRECISION_BYTES[precision]
    except KeyError:
        from planner.errors import ConfigError
        raise ConfigError("precision", precision, "one of " + ", ".join(PRECISION_BYTES)) from None


def _sp_divisor(tp, sp):
    """tp when sequence parallel, else 1 (works for bools and arrays: 1 + (tp - 1) sp)."""
    return 1 + (tp - 1) * sp


def block_activation_terms(spec: TransformerSpec, b, s, *, flash: bool = True, dropout: bool = False,
                           bytes_per_elem=2, residual_bytes_per_elem=None) -> dict:
    """Every term of the module docstring for one (decoder) block, unsharded, in bytes.
    Returns {"replicated": {...}, "sharded": {...}} (replicated = split only by SP)."""
    c = bytes_per_elem
    r = c if residual_bytes_per_elem is None else residual_bytes_per_elem
    t = b * s
    h = spec.hidden
    n_norm = spec.norms_per_block + (1 if spec.encoder_layers else 0)
    rms = spec.norm == "rmsnorm"
    norm_in = 4 if rms else r  # RMSNorm upcasts to fp32 and saves the upcast copy
    replicated = {
        "norm_inputs": n_norm * t * h * norm_in,
        "norm_normalized": n_norm * t * h * 4 * rms,
        "norm_stats": n_norm * t * 4 * (1 if rms else 2),
        "norm_outputs": n_norm * t * h * c,
        "dropout_masks": 2 * t * h * dropout,
    }
    attentions = 2 if spec.encoder_layers else 1  # T5 decoder: self + cross attention
    if flash:
        core = t * spec.heads * 4
    else:
        core = t * spec.heads * s * (c + dropout * (1 + c))
    sharded = {
        "qkv": attentions * t * (spec.attn_width + 2 * spec.kv_width) * c,
        "attn_out": attentions * t * spec.attn_width * c,
        "attn_core": attentions * core,
        "mlp": (4 if spec.gated_mlp else 2) * t * spec.d_ffn * c,
    }
    if spec.mla is not None or spec.moe is not None:
        rep, shard = moe_mla_bytes_per_token(spec, c)
        replicated |= {k: t * v for k, v in rep.items()}
        sharded |= {k: t * v for k, v in shard.items()}
    return {"replicated": replicated, "sharded": sharded}


def moe_mla_bytes_per_token(spec: TransformerSpec, c) -> tuple[dict, dict]:
    """Saved-for-backward bytes per token of an MoE MLP and of MLA, by what autograd keeps in
    planner.models.transformer (tests/test_moe_models.py measures them), as (replicated, sharded)
    dicts that replace the dense `mlp` / `qkv` / `attn_out` terms. c = compute bytes.

    MoE (k of E experts of width f_e, shared experts of total width f_s):
      router       E x 4 (fp32 softmax/sigmoid output) + k x 8 (chosen indices) + k x 4 + 4 (the
                   renormalization's numerator and denominator, with normalize_top_k)
      dispatch     k (3 h c + c + 16): each routed copy of the token (the expert's input), the
                   expert's output (kept by the gate-weight product) and the weighted output (kept by
                   the scatter-add back), the gathered weight and two int64 indices; replicated over
                   tensor-parallel ranks, which split f_e
      experts      k x 4 f_e c gated (2 f_e c plain), as a dense MLP of width k f_e
      shared       4 f_s c gated (2 f_s c), and Qwen2-MoE's gate: its sigmoid (c) and the shared output (h c)
    MLA (DeepSeek-V3 report Sec. 2.1.1): q (a d_qk c), k (a d_qk c), the kv_b output holding the values
    (a (d_nope + d_v) c), the output (a d_v c), and per latent (q_lora, kv_lora) RMSNorm's fp32 input
    copy and normalized copy (8 per element), its rstd (4) and output (c), the latents replicated
    (Megatron-Core's MLA does not split the down projections); in fp32 the kv latent's saved input is
    the whole kv_a output, rope part included."""
    rep, shard = {}, {}
    h = spec.hidden
    if spec.moe is not None:
        moe = spec.moe
        inner = 4 if spec.gated_mlp else 2
        rep["moe_router"] = moe.experts * 4 + moe.top_k * 8 + (moe.top_k * 4 + 4) * moe.normalize_top_k
        rep["moe_dispatch"] = moe.top_k * (3 * h * c + c + 16)
        shard["mlp"] = inner * c * (moe.top_k * moe.expert_ffn + moe.shared_experts * moe.d_shared_ffn)
        if moe.shared_expert_gate:
            rep["moe_shared_gate"] = c + h * c
    if spec.mla is not None:
        m, a = spec.mla, spec.heads
        shard["qkv"] = (2 * a * m.qk_head_dim + a * (m.qk_nope_head_dim + m.v_head_dim)) * c
        shard["attn_out"] = a * m.v_head_dim * c
        latents = [m.q_lora_rank, m.kv_lora_rank] if m.q_lora_rank else [m.kv_lora_rank]
        rope_in_fp32 = m.qk_rope_head_dim * 4 if c == 4 else 0
        rep["mla_latents"] = sum((8 + c) * r + 4 for r in latents) + rope_in_fp32
    return rep, shard


def block_activation_bytes(spec: TransformerSpec, b, s, *, tp=1, sp=False, recompute: str = "none",
                           flash: bool = True, dropout: bool = False, bytes_per_elem=2,
                           residual_bytes_per_elem=None):
    """Bytes one (decoder) block keeps for backward per micro-batch on one tensor-parallel rank.

    Korthikanti et al. 2022 Table 2 adapted as in the module docstring: replicated terms / (tp if
    sp else 1) + sharded terms / tp; "selective" drops attn_core; "full" keeps only the block input.
    `tp`, `b`, `s`, `sp` may be numpy arrays; `recompute`, `flash`, `dropout` are scalars.
    """
    r = bytes_per_elem if residual_bytes_per_elem is None else residual_bytes_per_elem
    if recompute == "full":
        return b * s * spec.hidden * r / _sp_divisor(tp, sp)
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, not {recompute!r}")
    terms = block_activation_terms(spec, b, s, flash=flash, dropout=dropout, bytes_per_elem=bytes_per_elem,
                                   residual_bytes_per_elem=residual_bytes_per_elem)
    sharded = dict(terms["sharded"])
    if recompute == "selective":
        sharded.pop("attn_core")
    return sum(terms["replicated"].values()) / _sp_divisor(tp, sp) + sum(sharded.values()) / tp


def encoder_block_activation_bytes(spec: TransformerSpec, b, s, **kwargs):
    """An encoder block of an encoder-decoder model: a decoder block without cross-attention."""
    if not spec.encoder_layers:
        return 0 * b * s
    return block_activation_bytes(spec.with_(encoder_layers=0), b, s, **kwargs)


def embedding_activation_bytes(spec: TransformerSpec, b, s, *, residual_bytes_per_elem=4):
    """Input side: the token ids (int64, 8 t bytes) kept by the embedding's backward, the position
    ids (8 s) for learned positions, and the rotary cos/sin tables (2 s d, in the residual dtype)
    that every block's RoPE multiplication keeps (one storage shared by all blocks). The embedding
    output itself is saved by the first block's norm and counted there."""
    rope = 2 * s * spec.d_head * residual_bytes_per_elem * (spec.position == "rope")
    return 8 * b * s + 8 * s * (spec.position == "learned") + rope


def head_activation_bytes(spec: TransformerSpec, b, s, *, tp=1, sp=False, bytes_per_elem=2,
                          residual_bytes_per_elem=None):
    """Output side before the loss: the final norm's input (last block output, r bytes), RMSNorm's
    normalized copy and stats, and the LM head's input (norm output, c bytes); split by SP."""
    c = bytes_per_elem
    r = c if residual_bytes_per_elem is None else residual_bytes_per_elem
    t = b * s
    h = spec.hidden
    rms = spec.norm == "rmsnorm"
    norm_in = 4 if rms else r
    norm = (t * h * norm_in + t * h * 4 * rms + t * 4 * (1 if rms else 2)) * spec.final_norm
    return (norm + t * h * c) / _sp_divisor(tp, sp)


def loss_activation_bytes(spec: TransformerSpec, b, s, *, tp=1):
    """Cross entropy keeps the fp32 log-softmax of the logits (t V / tp x 4 bytes; vocabulary
    split over tp with a vocab-parallel loss) and the int64 targets (8 t)."""
    t = b * s
    return t * spec.vocab * 4 / tp + 8 * t


def logits_transient_bytes(spec: TransformerSpec, b, s, *, tp=1, bytes_per_elem=2):
    """Not saved, but alive at the loss: the logits in the compute dtype (t V c / tp) plus their
    fp32 upcast (t V 4 / tp, only when c < 4) while the fp32 log-softmax is being written.
    A memory model adds this to the last pipeline stage's peak."""
    t = b * s
    upcast = 4 * (bytes_per_elem < 4)
    return t * spec.vocab * (bytes_per_elem + upcast) / tp


def model_activation_bytes(spec: TransformerSpec, b, s, *, tp=1, sp=False, recompute: str = "none",
                           flash: bool = True, dropout: bool = False, bytes_per_elem=2,
                           residual_bytes_per_elem=None):
    """Whole model on one device (no pipeline): embedding + all blocks + head + loss."""
    kw = dict(tp=tp, sp=sp, recompute=recompute, flash=flash, dropout=dropout, bytes_per_elem=bytes_per_elem,
              residual_bytes_per_elem=residual_bytes_per_elem)
    r = bytes_per_elem if residual_bytes_per_elem is None else residual_bytes_per_elem
    return (embedding_activation_bytes(spec, b, s, residual_bytes_per_elem=r) + spec.layers * block_activation_bytes(spec, b, s, **kw)
            + spec.encoder_layers * encoder_block_activation_bytes(spec, b, s, **kw)
            + head_activation_bytes(spec, b, s, tp=tp, sp=sp, bytes_per_elem=bytes_per_elem,
                                    residual_bytes_per_elem=residual_bytes_per_elem)
            + loss_activation_bytes(spec, b, s, tp=tp))
