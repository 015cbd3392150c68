"""What one transformer block saves for backward and moves through memory, per token, by implementation.

One table per implementation gives, per token of a micro-batch and per block, the bytes saved for
backward (activation memory) and the bytes streamed by memory-bound kernels in the forward pass
(their time); both come from the same list of operations, so memory and time cannot disagree.
Every quantity splits into three parts (class `Terms`):

    rep   bytes on every tensor-parallel rank (norms, residual, dropout masks): divided by tp only
          with sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2);
    shard bytes split over the tp ranks (projections, attention, MLP inner width);
    seq   bytes per token per token of sequence length, split over tp (materialized attention scores).

Implementations (a framework profile's `kernels`, frameworks/*.json):

- "fused": Megatron-LM / Transformer Engine kernels (fused bias-GeLU, bias-dropout-add,
  fused softmax), 2-byte activations under mixed precision. Saved bytes follow Korthikanti et al.
  2022, Sec. 4.1 (eq. 1: s b h (34 + 5 a s / h) per layer; with TP eq. 2, with SP eq. 4),
  generalized to GQA, gated MLPs and any ffn width; with flash attention the 5 a s / h scores
  term is replaced by the kernel's output and log-sum-exp.
- "eager": PyTorch eager modules as Hugging Face transformers writes them: under autocast the residual stream and norms stay fp32, every projection casts its
  input to bf16 (a saved copy per call), HF's python `gelu_new` saves four fp32/bf16 tensors, HF's
  RMSNorm saves an fp32 copy of its input, rotary embeddings are applied in the residual dtype,
  SDPA (flash / memory-efficient) saves q, k, v, out and the log-sum-exp. Each count is the
  tensor autograd keeps (torch's derivatives.yaml) for the op sequence of the HF module.
- "torch": plain PyTorch modules as torchtitan (and this project's executor, planner/models/
  transformer.py) write them, under FSDP2-style mixed precision: parameters are cast to bf16, so the
  whole block, the residual stream included, runs in the 16-bit dtype (no autocast casts per call);
  fused activation functions. The same op list as "eager" without autocast and without HF's python
  gelu_new.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.spec import TransformerSpec

FP8_BYTES = 1.0
"""Bytes per element of an FP8 tensor (E4M3 or E5M2; Micikevicius et al. 2022, "FP8 Formats for
Deep Learning")."""
NVFP4_BYTES = 0.5 + 1.0 / 16.0
"""Bytes per element of an NVFP4 tensor: two E2M1 values per byte and one E4M3 scale byte per 16
elements (Transformer Engine's NVFP4Tensor: packed data of shape[-1] / 2 bytes and a uint8 scale
per 16-element block; its fp32 per-tensor scale is negligible)."""


BLOCK_SCALED_SCALINGS = ("mxfp8", "nvfp4")
"""FP8 recipes whose scales run in blocks along one axis, so the transposed operand is a copy
quantized of its own (Transformer Engine's MXFP8Tensor / NVFP4Tensor hold row-wise and
column-wise data; a tensorwise scale serves both orientations of one FP8 copy)."""


def quantized_bytes(fp8_scaling: str) -> float:
    """Bytes per element of one copy of a tensor quantized by the run's FP8 recipe (a GEMM weight, a
    linear layer's saved input): NVFP4_BYTES under nvfp4, else FP8_BYTES."""
    return NVFP4_BYTES if fp8_scaling == "nvfp4" else FP8_BYTES


IMPLEMENTATIONS = ("fused", "eager", "torch")


@dataclass(frozen=True, kw_only=True, slots=True)
class Terms:
    """Bytes per token split by how tensor/sequence parallelism divides them."""

    rep: float = 0.0
    """Bytes replicated on every tp rank (divided by tp only under sequence parallelism)."""
    shard: float = 0.0
    """Bytes divided by tp."""
    seq: float = 0.0
    """Bytes per token of sequence length, divided by tp (attention score matrices)."""

    def at(self, tp, sp, s):
        """Bytes per token on one rank for tp degree(s), SP flag(s) and sequence length(s) (numbers or arrays;
        Step.per_token calls this once per table entry of a chunk, so no conversions)."""
        return self.rep * np.where(sp, 1.0 / tp, 1.0) + (self.shard + self.seq * s) / tp

    def __add__(self, other: "Terms") -> "Terms":
        return Terms(
            rep=self.rep + other.rep, shard=self.shard + other.shard, seq=self.seq + other.seq
        )

    def scaled(self, k: float) -> "Terms":
        return Terms(rep=self.rep * k, shard=self.shard * k, seq=self.seq * k)


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockTable:
    """Per-token, per-block quantities of one implementation at one precision."""

    saved: Terms
    """Saved for backward without recomputation."""
    saved_full_recompute: Terms
    """Saved with full (per-block) recomputation: the block input (Korthikanti Sec. 5, 2 s b h)."""
    scores_saved: Terms = field(default_factory=Terms)
    """Part of `saved` that selective recomputation drops (the attention core's s x s tensors)."""
    traffic_fwd: Terms
    """Bytes read + written by memory-bound kernels in the forward (GEMMs and attention excluded)."""
    scores_traffic_fwd: Terms = field(default_factory=Terms)
    """Part of `traffic_fwd` on the s x s scores (softmax, dropout): re-run by selective recompute."""
    copy_traffic_fwd: Terms = field(default_factory=Terms)
    """Part of `traffic_fwd` in copy-like ops, whose backward streams COPY_BWD_TRAFFIC_FACTOR x
    their forward bytes instead of BWD_TRAFFIC_FACTOR x (unfused_rope_traffic,
    moe_expert_traffic)."""
    kernels_fwd: float
    """Operator launches of one block forward (host dispatch floor)."""


def blend(mask, a: BlockTable, b: BlockTable) -> BlockTable:
    """Per candidate, table `a` where `mask` else `b` (array-valued terms)."""

    def pick(x: Terms, y: Terms) -> Terms:
        return Terms(
            rep=np.where(mask, x.rep, y.rep),
            shard=np.where(mask, x.shard, y.shard),
            seq=np.where(mask, x.seq, y.seq),
        )

    return BlockTable(
        saved=pick(a.saved, b.saved),
        saved_full_recompute=pick(a.saved_full_recompute, b.saved_full_recompute),
        scores_saved=pick(a.scores_saved, b.scores_saved),
        traffic_fwd=pick(a.traffic_fwd, b.traffic_fwd),
        scores_traffic_fwd=pick(a.scores_traffic_fwd, b.scores_traffic_fwd),
        copy_traffic_fwd=pick(a.copy_traffic_fwd, b.copy_traffic_fwd),
        kernels_fwd=np.where(mask, a.kernels_fwd, b.kernels_fwd),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class HeadTable:
    """Per-token quantities of the output side (final norm, LM head, loss) on the last stage."""

    saved: Terms
    logits_peak: Terms
    """Largest transient of the logits and loss (forward end or backward start)."""
    logits_fwd_end: Terms
    """Logits bytes alive at the end of the forward (before backward starts)."""
    traffic_fwd: Terms
    traffic_bwd: Terms
    kernels: float


BWD_TRAFFIC_FACTOR = 2.0
"""Backward of a memory-bound op streams about twice its forward bytes (reads the output grad and
the saved inputs, writes the input grad; e.g. y = f(x): fwd r x + w y, bwd r dy + r x + w dx)."""
COPY_BWD_TRAFFIC_FACTOR = 1.0
"""Backward of a copy-like op streams about its forward bytes: a concatenation, a slice, a broadcast
add or a product with a small table reads the output gradient and writes the input gradient, and
reads nothing saved of the token's size (fwd r x + w y, bwd r dy + w dx). For the ops counted so
(BlockTable.copy_traffic_fwd), autograd's backward streams, per element and in units of c: RoPE 10
against 12 forward, the clamp and concatenation 10 against 8 (each clamp reads its input for the
mask, the chunk's backward concatenates the two gradients), the expert bias 6 against 6."""

UNFUSED_ROPE_BYTES_PER_ELEMENT = 12
"""Bytes per query or key element, in units of c, of Megatron-Core's unfused RoPE
(_apply_rotary_pos_emb_bshd, megatron/core/models/common/embeddings/rope_utils.py at core_r0.16.0):
t * cos (r c, w c), the negated half of rotate_half (r c/2, w c/2), its concatenation (r c, w c),
x sin (r c, w c), the sum (r 2c, w c), the concatenation with the unrotated part (r c, w c). The
cos and sin tables are per position, not per head: left out. Transformer Engine's fused kernel,
which the table leaves out as it leaves out other small fused kernels, streams 2 c."""
UNFUSED_ROPE_LAUNCHES = 22
"""Launches the unfused RoPE adds per block forward over the fused kernel's two: on each of q and
k, cos or sin, the mscale product and the cast for each table (6), then the six ops above."""


def unfused_rope_traffic(spec: TransformerSpec, c) -> Terms:
    """Forward bytes per token of RoPE run unfused: Megatron-Core's apply_rotary_pos_emb takes
    Transformer Engine's fused kernel only when the attention factor (mscale) is 1 and falls back
    to _apply_rotary_pos_emb_bshd otherwise (rope_utils.py at core_r0.16.0, the "mscale ... is not
    supported by TE's fused RoPE" branch): YaRN models whose factor is not 1 (gpt-oss,
    spec.rope_attention_factor). UNFUSED_ROPE_BYTES_PER_ELEMENT c over the q and k widths, sharded
    with the heads. MLA rotates its own rope slice (multi_latent_attention.py): not this path."""
    if spec.position != "rope" or spec.rope_attention_factor == 1.0 or spec.mla is not None:
        return Terms()
    return Terms(shard=UNFUSED_ROPE_BYTES_PER_ELEMENT * c * (spec.attn_width + spec.kv_width))


EXPERT_BIAS_BYTES_PER_ELEMENT = 6
"""Bytes per element of h per routed copy, in units of c, of TEGroupedMLP._apply_bias
(megatron/core/transformer/moe/experts.py at core_r0.16.0): fc2 returns its bias apart
(skip_bias_add) and the bias is added per expert, weighted by the routing probability: b p (w c),
t + b p (r 2c, w c), the concatenation of the experts' slices (r c, w c), with the probabilities in
the router's dtype, as the all-to-all dispatcher hands them over."""
EXPERT_BIAS_FP32_PROBS_BYTES = 24
"""The same with fp32 probabilities, as the flex dispatcher hands them to DeepEP and HybridEP
(token_dispatcher.py at core_r0.16.0 casts token_probs to float32), 24 + 2 c bytes: b p in fp32
(w 4), t + b p (r c + 4, w 4), the concatenation (r 4, w 4), the cast back (r 4, w c)."""
CLAMP_BYTES_PER_ELEMENT = 8
"""Bytes per element of f_e per routed copy, in units of c, of weighted_bias_quick_geglu_impl's
clamp (megatron/core/fusions/fused_bias_geglu.py at core_r0.16.0): the gate half clamped above and
the linear half to +-limit (r 2 f c, w 2 f c together), then concatenated again (r 2 f c, w 2 f c)
before the fused activation."""


def megatron_unfused_ops(
    spec: TransformerSpec, c, *, fp32_probs: bool = False
) -> tuple[Terms, float]:
    """Forward bytes per token and launches of the ops Megatron-Core runs unfused for this model
    (unfused_rope_traffic, moe_expert_traffic): what the fused table holds beyond its fused kernels,
    and what torch.compile would fuse (cost_models.activations)."""
    rope = unfused_rope_traffic(spec, c)  # none under MLA
    experts, launches = moe_expert_traffic(spec, c, fp32_probs=fp32_probs)
    return rope + experts, launches + UNFUSED_ROPE_LAUNCHES * (rope.shard > 0)


def moe_expert_traffic(
    spec: TransformerSpec, c, *, fp32_probs: bool = False
) -> tuple[Terms, float]:
    """Forward bytes per token and launches of the routed experts' ops that Megatron-Core runs
    outside its fused kernels: fc2's bias (spec.mlp_bias; EXPERT_BIAS_BYTES_PER_ELEMENT per element
    of h, EXPERT_BIAS_FP32_PROBS_BYTES + 2 c with `fp32_probs`) and the activation clamp
    (spec.activation_clamp; CLAMP_BYTES_PER_ELEMENT per element of f_e), per routed copy (top_k
    per token). gpt-oss has both. The bias's per-expert products are launched
    once per local expert, which the table cannot count (it does not know ep); the clamp is 3."""
    moe = spec.moe
    if moe is None:
        return Terms(), 0.0
    per_element = (
        EXPERT_BIAS_FP32_PROBS_BYTES + 2 * c if fp32_probs else EXPERT_BIAS_BYTES_PER_ELEMENT * c
    )
    bias = per_element * spec.hidden if spec.mlp_bias else 0.0
    clamp = CLAMP_BYTES_PER_ELEMENT * c * moe.expert_ffn if spec.activation_clamp else 0.0
    return Terms(rep=moe.top_k * bias, shard=moe.top_k * clamp), 3.0 * bool(clamp)


def compute_bytes(precision: str) -> int:
    """Bytes of an activation element in the math dtype."""
    return 4 if precision == "fp32" else 2


def _fused_qkv(spec: TransformerSpec) -> bool:
    return spec.model_type in ("gpt2", "gpt_neox", "bloom", "falcon")


def _torch_precision(precision: str) -> str:
    """Under FSDP2-style mixed precision the module computes in its parameters' 16-bit dtype: the
    activations are those of a bf16 model (fp8 recipes keep bf16 activations between GEMMs)."""
    return "bf16" if precision in ("amp-bf16", "amp-fp16", "fp8") else precision


def block_table(
    spec: TransformerSpec,
    precision: str,
    kernels: str,
    *,
    flash: bool = True,
    dropout: bool = False,
    fused_norm: bool = False,
    activation_fp8_input: bool = False,
    fp8_scaling: str = "tensorwise",
    fp32_probs: bool = False,
) -> BlockTable:
    """The per-token table of one block for `kernels` (IMPLEMENTATIONS); `fused_norm`: the eager block's RMSNorms
    run as one fused kernel (_eager_block); `activation_fp8_input`: the fused SwiGLU keeps its input in FP8
    (_megatron_block; Megatron-Core's activation_func_fp8_input_store, fused kernels only);
    `fp8_scaling`: the FP8 recipe, whose element size the linear layers' saved inputs take
    (quantized_bytes); `fp32_probs`: the MoE dispatcher hands the routing probabilities to the
    experts in fp32 (moe_expert_traffic)."""
    if activation_fp8_input and kernels != "fused":
        raise ValueError("activation_fp8_input is Megatron-Core's fused SwiGLU (kernels 'fused')")
    if (
        spec.moe is not None or spec.mla is not None
    ):  # its dense base table (block_table) has the QK-norm
        return _moe_mla_block(
            spec,
            precision,
            kernels,
            flash=flash,
            dropout=dropout,
            activation_fp8_input=activation_fp8_input,
            fp8_scaling=fp8_scaling,
            fp32_probs=fp32_probs,
        )
    if kernels == "fused":
        table = _megatron_block(
            spec,
            precision,
            flash=flash,
            dropout=dropout,
            activation_fp8_input=activation_fp8_input,
            fp8_scaling=fp8_scaling,
        )
    elif kernels == "eager":
        table = _eager_block(
            spec,
            precision,
            dropout=dropout,
            python_gelu=spec.activation == "gelu_new",
            fused_norm=fused_norm,
        )
        if not flash:  # SDPA's flash saves only the log-sum-exp; the math path keeps the scores
            c = compute_bytes(precision)
            scores = _math_scores(spec, c, dropout)
            table = _replace(
                table,
                saved=table.saved + Terms(shard=-4.0 * spec.heads) + scores,
                scores_saved=scores,
                traffic_fwd=table.traffic_fwd + _math_scores_traffic(spec, c, dropout),
                scores_traffic_fwd=_math_scores_traffic(spec, c, dropout),
            )
    elif kernels == "torch":
        table = _torch_block(
            spec, _torch_precision(precision), flash=flash, dropout=dropout, fused_norm=fused_norm
        )
    else:
        raise ValueError(f"kernels must be one of {IMPLEMENTATIONS}, not {kernels!r}")
    if not flash and spec.n_kv_heads < spec.heads:
        # the math path repeats K and V to every query head before its matmuls and keeps the copies
        # (SDPA's math kernel with enable_gqa, HF's repeat_kv, Megatron's unfused attention)
        c = compute_bytes(precision if kernels != "torch" else _torch_precision(precision))
        extra = 2 * c * (spec.attn_width - spec.kv_width)
        table = _replace(
            table,
            saved=table.saved + Terms(shard=extra),
            traffic_fwd=table.traffic_fwd
            + Terms(shard=2 * c * spec.kv_width + extra + 2 * c * spec.kv_width),
        )
    return _with_qk_norm(table, spec, precision, kernels, fused_norm=fused_norm)


def _with_qk_norm(
    table: BlockTable,
    spec: TransformerSpec,
    precision: str,
    kernels: str,
    *,
    fused_norm: bool = False,
) -> BlockTable:
    """QK-norm (an RMSNorm over each head's head_dim on the queries and keys before the rotary embedding: Qwen3,
    OLMo 2, Gemma 3; Dehghani et al. 2023, "Scaling Vision Transformers to 22B Parameters", Sec. 3.1): per token
    its saved tensors, streamed bytes and launches, over the a d query and k d key elements and their a + k rows
    (rstd, 4 bytes each), all sharded over tp with the heads. The rotary embedding after it saves only its
    tables, and the attention kernel saves the rotated q and k either way, so the norm adds what it keeps:
      fused (Transformer Engine's RMSNorm in Megatron-Core's qk_layernorm) and torchtitan's fused_rmsnorm: its
        input, c per element;
      eager (Hugging Face's Qwen3RMSNorm: x.to(fp32), pow.mean, x * rsqrt, weight * x.to(dtype)): the fp32 copy
        and the normalized x in the input dtype, 4 + c;
      torch (nn.RMSNorm's composite, planner/models/transformer.py and torchtitan): the fp32 input and the fp32
        normalized x, 8 (measured with saved-tensor hooks: tests/test_profiler_torch.py, Qwen3's shape).
    Streamed bytes and launches per norm are the block norm's of the same kernels (_eager_block); MLA has no
    QK-norm (its latent norms are in _moe_mla_block)."""
    if not spec.qk_norm or spec.mla is not None:
        return table
    c = compute_bytes(_torch_precision(precision) if kernels == "torch" else precision)
    fused = kernels == "fused" or fused_norm
    per, traffic, launches = (
        (c, 2 * c, 1)
        if fused
        else (
            4 + c if kernels == "eager" else 8,
            8 + 4 + 8 + 2 * c + (0 if c == 4 else 2 * (c + 4)),
            6 + (0 if c == 4 else 2),
        )
    )
    width, rows = spec.attn_width + spec.kv_width, spec.heads + spec.n_kv_heads
    return _replace(
        table,
        saved=table.saved + Terms(shard=width * per + 4.0 * rows),
        traffic_fwd=table.traffic_fwd + Terms(shard=width * traffic),
        kernels_fwd=table.kernels_fwd + 2 * launches,
    )


def _replace(table: BlockTable, **changes) -> BlockTable:
    from dataclasses import replace

    return replace(table, **changes)


def _math_scores(spec: TransformerSpec, c: float, dropout: bool) -> Terms:
    """Saved by a materialized attention per token per token of sequence: the softmax output (c per
    score and head), plus with dropout its mask (1) and output (c)."""
    return Terms(seq=spec.heads * (c + (1 + c) * dropout))


def _math_scores_traffic(spec: TransformerSpec, c: float, dropout: bool) -> Terms:
    """Memory-bound passes over the s x s scores of a materialized attention: the causal mask add
    (read scores and mask, write: 3 c) and the softmax (read, write: 2 c), plus dropout (2 c + 1)."""
    return Terms(seq=spec.heads * (5 * c + (2 * c + 1) * dropout))


def residual_bytes(precision: str, kernels: str) -> int:
    """Bytes of a residual-stream element: fp32 under torch.autocast (the HF "eager" modules keep the
    residual in the parameters' fp32), the math dtype otherwise (fused kernels; torch modules whose
    parameters FSDP2 casts to 16 bits)."""
    if kernels == "torch":
        precision = _torch_precision(precision)
    return (
        4
        if precision == "fp32" or (kernels == "eager" and precision.startswith("amp"))
        else compute_bytes(precision)
    )


def _torch_block(
    spec: TransformerSpec, precision: str, *, flash: bool, dropout: bool, fused_norm: bool = False
) -> BlockTable:
    """Plain PyTorch modules (planner/models/transformer.py, torchtitan's): what autograd saves, term
    by term, measured with torch.autograd.graph.saved_tensors_hooks (tests/test_profiler_torch.py):

        norm inputs      n_norm h r   (RMSNorm upcasts 16-bit inputs to fp32 and saves that copy: h 4)
        norm normalized  n_norm h 4   (RMSNorm's fp32 x * rstd for the weight gradient)
        norm stats       n_norm 4 (2 LayerNorm: mean, rstd | 1 RMSNorm: rstd)
        norm outputs     n_norm h c   (the input of the next GEMM)
        dropout masks    2 h          (residual dropouts, only with dropout)
        q, k, v          (a d + 2 k d) c  (SDPA with enable_gqa: no repeated K/V)
        attention out    a d c        (also W_O's input)
        attention core   flash: a 4 (fp32 log-sum-exp); math: a s c (+ mask a s + dropout out a s c)
        MLP              2 f c (activation in/out); gated 4 f c (W1 out, W3 out, act out, product)
    per token (h hidden, a heads, k kv heads, d head dim, f ffn, c math bytes, r residual bytes);
    the norm terms are replicated over tp (split only by sequence parallelism), the rest split over
    tp. Korthikanti et al. 2022 Table 2 is the fused special case. Memory-bound traffic and kernel
    counts are those of the "eager" op list without autocast casts and with fused activations.
    `fused_norm` (torchtitan's fused_rmsnorm, TritonFusedRMSNorm in torchtitan/models/norms.py, which saves
    x, weight and rstd): an RMSNorm keeps its input in the residual dtype (h r) and rstd, no fp32 copies."""
    c = compute_bytes(precision)
    r = residual_bytes(precision, "torch")
    h, a = spec.hidden, spec.heads
    n_norm = spec.norms_per_block + (1 if spec.encoder_layers else 0)
    rms = spec.norm == "rmsnorm"
    upcast = (
        rms and not fused_norm
    )  # the module's RMSNorm keeps an fp32 copy and the fp32 normalized x
    rep = (
        n_norm * (h * (4 if upcast else r) + h * 4 * upcast + 4 * (1 if rms else 2) + h * c)
        + 2 * h * dropout
    )
    attentions = 2 if spec.encoder_layers else 1
    shard = (
        attentions * ((spec.attn_width + 2 * spec.kv_width) * c + spec.attn_width * c)
        + (4 if spec.gated_mlp else 2) * spec.d_ffn * c
    )
    core = (
        Terms(shard=attentions * a * 4.0)
        if flash
        else Terms(seq=attentions * a * (c + dropout * (1 + c)))
    )
    ops = _eager_block(spec, precision, dropout=dropout, python_gelu=False, fused_norm=fused_norm)
    scores_traffic = Terms() if flash else _math_scores_traffic(spec, c, dropout)
    return BlockTable(
        saved=Terms(rep=rep, shard=shard) + core,
        saved_full_recompute=Terms(rep=r * h),
        scores_saved=core,
        traffic_fwd=ops.traffic_fwd + scores_traffic,
        scores_traffic_fwd=scores_traffic,
        kernels_fwd=ops.kernels_fwd,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OpSac:
    """Selective recomputation by operator (torchtitan's `activation_checkpoint.mode = "selective"` with
    `selective_ac_option = "op"`; torchtitan/models/llama3/infra/parallelize.py `_save_list`): inside each
    checkpointed block the outputs of the attention kernel and of every other matmul are saved, all
    else (the other matmuls, norms, rotary embedding, activation function) is recomputed."""

    saved: Terms
    """Per token: the block input, the kept matmul outputs, the attention output and log-sum-exp."""
    gemm_fraction: float
    """Share of the block's linear-layer forward FLOPs recomputed (the matmuls not saved)."""


SELECTIVE_POLICIES = ("attention", "op")
"""Selective recomputation: Megatron's attention core only (Korthikanti et al. 2022 Sec. 5), or torchtitan's
per-operator policy (OpSac)."""


def op_sac(spec: TransformerSpec, precision: str, kernels: str) -> OpSac:
    """The matmuls of a block in call order, q, k, v, o, then w1, w3 (gated) and w2: torchtitan's policy
    counts them and saves the odd ones (1st, 3rd, ...), so q, v, w1 and w2 (w2, w3 gated: the 7th and
    5th) are saved and k, o and w3 recomputed; plus the SDPA output (a d c) and its fp32 log-sum-exp
    (a 4), and the block input (r h). Terms: w2's output and the input replicated over tp, the rest
    sharded. A mixture-of-experts or MLA block keeps the attention policy (no torchtitan MoE SAC)."""
    c = compute_bytes(_torch_precision(precision) if kernels == "torch" else precision)
    r = residual_bytes(precision, kernels)
    h, f = spec.hidden, spec.d_ffn
    linears = (
        [
            ("q", spec.attn_width, h),
            ("k", spec.kv_width, h),
            ("v", spec.kv_width, h),
            ("o", h, spec.attn_width),
            ("w1", f, h),
        ]
        + ([("w3", f, h)] if spec.gated_mlp else [])
        + [("w2", h, f)]
    )
    kept = [name for i, (name, _, _) in enumerate(linears) if i % 2 == 0]
    flops = {name: out * k for name, out, k in linears}
    recomputed = sum(v for name, v in flops.items() if name not in kept) / sum(flops.values())
    out_bytes = {name: out * c for name, out, _ in linears}
    rep = (
        r * h
        + (out_bytes["w2"] if "w2" in kept else 0.0)
        + (out_bytes["o"] if "o" in kept else 0.0)
    )
    shard = (
        sum(out_bytes[n] for n in kept if n not in ("w2", "o"))
        + spec.attn_width * c
        + 4.0 * spec.heads
    )
    return OpSac(saved=Terms(rep=rep, shard=shard), gemm_fraction=recomputed)


RECOMPUTE_MODULES = (
    "core_attn",
    "layernorm",
    "mlp",
    "moe",
    "moe_act",
    "shared_experts",
    "mla_up_proj",
)
"""Megatron-Core's --recompute-modules (TransformerConfig.recompute_modules, used with recompute_granularity
selective; default ["core_attn"]): the attention core, the separate norms, a dense block's MLP, the whole MoE
layer, the routed experts' activation function, the shared experts, MLA's up-projections."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleSac:
    """Selective recomputation by module (Megatron-Core's recompute_modules): what a block keeps and what its
    backward re-runs (cost_models.compute.block_seconds, cost_models.moe.ep_block_seconds)."""

    modules: tuple[str, ...]
    saved: Terms
    """Per token: the block's saved tensors less those of the recomputed modules (module_sac)."""
    core_attn: bool
    """The attention core re-runs (its s x s work under unfused attention)."""
    gemms: frozenset
    """Names of the GEMMs re-run (cost_models.flops.block_gemm_shapes)."""
    elem: Terms
    """Memory-bound bytes per token re-streamed (norms, activation functions, the MoE permutation)."""
    moe_layer: bool
    """The whole MoE layer re-runs: its dispatch and combine exchanges and its permutations too."""


def module_sac(
    spec: TransformerSpec,
    precision: str,
    modules,
    *,
    activation_fp8_input: bool = False,
    fp8_scaling: str = "tensorwise",
    fp32_probs: bool = False,
) -> ModuleSac:
    """What Megatron-Core's selective recomputation of `modules` (RECOMPUTE_MODULES) drops from a block's saved
    tensors (the Megatron table, _megatron_block / _moe_mla_block, c = compute bytes, lin = a linear layer's saved
    input: 1 byte under FP8) and re-runs (megatron/core/transformer/transformer_layer.py, moe/moe_layer.py,
    moe/experts.py, multi_latent_attention.py; Megatron-LM d98e8a6):
      core_attn       the attention core's s x s tensors (the default, Korthikanti et al. 2022 Sec. 5);
      layernorm       the outputs of the norms that run as separate modules, lin h each: the MoE layer's
                      pre-MLP norm and MLA's input norm (Transformer Engine fuses the others into the next
                      linear, where nothing is freed); re-run as 2 c h streamed per norm;
      mlp             a dense block's MLP inner tensors (SwiGLU input 2 c f, or GeLU's c f, and fc2's input
                      lin f); re-run as its three (two) GEMMs and the activation;
      moe             the whole MoE layer but its input: the router and dispatch terms (moe_mla_bytes_per_token)
                      and the expert MLPs' inner tensors (width k f_e + S f_s); re-run as the router, expert and
                      shared-expert GEMMs, the permutations and the dispatch and combine exchanges;
      moe_act         the routed experts' fc2 input, lin k f_e; re-run as the weighted SwiGLU (3 c k f_e);
      shared_experts  the shared experts' inner tensors (S f_s wide); re-run as their GEMMs and activation;
      mla_up_proj     MLA's q, k and v (the up-projections' outputs after RoPE); re-run as the q_b and kv_b GEMMs.
    A module the block does not have frees nothing (Megatron-Core ignores it too). With `activation_fp8_input` the
    SwiGLU inputs a module frees are the FP8 copies (block_table)."""
    mods = tuple(modules)
    c = compute_bytes(precision)
    lin = quantized_bytes(fp8_scaling) if precision == "fp8" else c
    table = block_table(
        spec,
        precision,
        "fused",
        activation_fp8_input=activation_fp8_input,
        fp8_scaling=fp8_scaling,
    )
    h, moe, mla = spec.hidden, spec.moe, spec.mla
    act_in = 1.0 if activation_fp8_input and spec.swiglu else None

    def inner(width):
        return mlp_inner_saved(spec.gated_mlp, c, lin, width, act_in)

    def act_traffic(width):
        return mlp_act_traffic(spec.gated_mlp, c, width)

    dropped, elem, gemms = Terms(), Terms(), set()
    if "core_attn" in mods:
        dropped = dropped + table.scores_saved
    if "layernorm" in mods:
        norms = (moe is not None) + (mla is not None)
        dropped = dropped + Terms(rep=norms * lin * h)
        elem = elem + Terms(rep=norms * 2.0 * c * h)
    if "mlp" in mods and moe is None:
        dropped = dropped + Terms(shard=inner(spec.d_ffn))
        elem = elem + Terms(shard=act_traffic(spec.d_ffn))
        gemms |= {"w1", "w2", "w3"}
    if moe is not None:
        d, e, g = _moe_modules_sac(spec, precision, mods, c, lin, fp8_scaling, fp32_probs, inner)
        dropped, elem, gemms = dropped + d, elem + e, gemms | g
    if mla is not None and "mla_up_proj" in mods:
        _, shard = moe_mla_bytes_per_token(
            spec, c, kernels="fused", precision=precision, fp8_scaling=fp8_scaling
        )
        dropped = dropped + Terms(shard=shard["qkv"])
        gemms |= {"wq_b", "wkv_b"}
    kept = table.saved
    saved = Terms(
        rep=max(kept.rep - dropped.rep, table.saved_full_recompute.rep),
        shard=max(kept.shard - dropped.shard, 0.0),
        seq=max(kept.seq - dropped.seq, 0.0),
    )
    return ModuleSac(
        modules=mods,
        saved=saved,
        core_attn="core_attn" in mods,
        gemms=frozenset(gemms),
        elem=elem,
        moe_layer=moe is not None and "moe" in mods,
    )


def _moe_modules_sac(spec, precision, mods, c, lin, fp8_scaling, fp32_probs, inner) -> tuple:
    """(dropped, streamed, GEMMs) of module_sac's MoE modules: `moe` (the whole layer but its
    input), else `moe_act` and `shared_experts` (module_sac's docstring); `inner(width)` is the MLP
    inner tensors' saved bytes per token at that width."""
    moe, h = spec.moe, spec.hidden
    shared_width = moe.shared_experts * moe.d_shared_ffn
    dropped, elem, gemms = Terms(), Terms(), set()

    def act_traffic(width):
        return mlp_act_traffic(spec.gated_mlp, c, width)

    if "moe" in mods:
        rep, _ = moe_mla_bytes_per_token(
            spec, c, kernels="fused", precision=precision, fp8_scaling=fp8_scaling
        )
        moe_rep = sum(v for k, v in rep.items() if k.startswith("moe_"))
        dropped = Terms(rep=moe_rep, shard=inner(moe.top_k * moe.expert_ffn + shared_width))
        elem = (
            Terms(
                rep=moe.top_k * 5 * h * c + 8.0 * moe.experts,  # gather, scatter, weighting
                shard=act_traffic(moe.top_k * moe.expert_ffn + shared_width),
            )
            + moe_expert_traffic(spec, c, fp32_probs=fp32_probs)[0]
        )
        gemms = {"router", "experts_w1", "experts_w2", "experts_w3"}
        return dropped, elem, gemms | {"shared_w1", "shared_w2", "shared_w3", "shared_gate"}
    if "moe_act" in mods:  # the activation function with its clamp (moe_expert_traffic)
        dropped = dropped + Terms(shard=lin * moe.top_k * moe.expert_ffn)
        clamp = moe_expert_traffic(spec.with_(mlp_bias=False), c)[0]
        elem = elem + Terms(shard=act_traffic(moe.top_k * moe.expert_ffn)) + clamp
    if "shared_experts" in mods and shared_width:
        dropped = dropped + Terms(shard=inner(shared_width))
        elem = elem + Terms(shard=act_traffic(shared_width))
        gemms |= {"shared_w1", "shared_w2", "shared_w3", "shared_gate"}
    return dropped, elem, gemms


def moe_mla_bytes_per_token(
    spec: TransformerSpec,
    c,
    *,
    kernels: str = "eager",
    precision: str = "amp-bf16",
    fp8_scaling: str = "tensorwise",
) -> tuple[dict, dict]:
    """Saved-for-backward bytes per token of an MoE MLP and of MLA, as (replicated, sharded) dicts that
    replace the dense `mlp` / `qkv` / `attn_out` terms. c = compute bytes. The MoE layer's dispatch depends
    on the implementation (`kernels`): the eager layer of planner.models.transformer (tests/test_moe_models.py
    measures it), or Megatron-Core's ('fused': MoELayer with the all-to-all dispatcher and TEGroupedMLP).

    MoE (k of E experts of width f_e, shared experts of total width f_s):
      router       E x 4 (fp32 softmax/sigmoid output) + k x 8 (chosen indices) + k x 4 + 4 (the
                   renormalization's numerator and denominator, with normalize_top_k)
      dispatch     eager: k (3 h c + c + 16): each routed copy of the token (the expert's input), the
                   expert's output (kept by the gate-weight product) and the weighted output (kept by
                   the scatter-add back), the gathered weight and two int64 indices; replicated over
                   tensor-parallel ranks, which split f_e.
                   Megatron-Core: k (h c_in + 4 + 16): only the routed fc1 input, saved by Transformer
                   Engine's GroupedLinear (1 byte per element under FP8: its column-wise FP8 copy), the
                   routed probability in fp32 (kept by the weighted SwiGLU, which applies it) and the
                   permutation map; the all-to-all and unpermute save nothing (megatron/core/transformer/moe/
                   experts.py TEGroupedMLP, fused_bias_swiglu.py WeightedSwiGLUFunction, moe_utils.py;
                   transformer_engine/pytorch/module/grouped_linear.py; Megatron-LM d98e8a6, TE 2.20)
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
        rep["moe_router"] = (
            moe.experts * 4 + moe.top_k * 8 + (moe.top_k * 4 + 4) * moe.normalize_top_k
        )
        if kernels == "fused":
            c_in = quantized_bytes(fp8_scaling) if precision == "fp8" else c
            rep["moe_dispatch"] = moe.top_k * (h * c_in + 4 + 16)
        else:
            rep["moe_dispatch"] = moe.top_k * (3 * h * c + c + 16)
        shard["mlp"] = (
            inner * c * (moe.top_k * moe.expert_ffn + moe.shared_experts * moe.d_shared_ffn)
        )
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


MOE_EXTRA_KERNELS = 10.0
"""Launches an MoE block adds to its dense counterpart (router GEMM, softmax/sigmoid, top-k,
permute, unpermute, weighting; grouped GEMMs replace the MLP's): an estimate, not measured."""
MLA_EXTRA_KERNELS = 6.0
"""Launches MLA adds (two more projections, two latent norms, splits and concatenations): an estimate."""


def _moe_mla_block(
    spec: TransformerSpec,
    precision: str,
    kernels: str,
    *,
    flash: bool,
    dropout: bool,
    activation_fp8_input: bool = False,
    fp8_scaling: str = "tensorwise",
    fp32_probs: bool = False,
) -> BlockTable:
    """An MoE and/or MLA block: the table of the dense block with the MLP width a token goes through
    (k f_e + S f_s) and, for MLA, a query/key/value heads of d_qk, whose saved q, k, v and output,
    4 a d_qk, are corrected to MLA's q, k, kv_b output and output, 2 a d_qk + a (d_nope + d_v) + a d_v
    (equal for DeepSeek-V3: both 768 a; not for other head widths), plus the replicated per-token terms of
    moe_mla_bytes_per_token (router, dispatched copies, latents), and the
    dispatch traffic: each routed copy gathered, scattered back and weighted, ~5 h c per copy, and
    the router's fp32 scores written and read (2 x 4 E)."""
    ffn = spec.moe.active_ffn if spec.moe is not None else spec.ffn
    dense = spec.with_(
        moe=None, mla=None, ffn=ffn, head_dim=spec.d_head, kv_heads=0 if spec.mla else spec.kv_heads
    )
    if spec.mla is not None:  # MLA's rope slice has its own path (unfused_rope_traffic)
        dense = dense.with_(rope_attention_factor=1.0)
    base = block_table(
        dense,
        precision,
        kernels,
        flash=flash,
        dropout=dropout,
        activation_fp8_input=activation_fp8_input,
        fp8_scaling=fp8_scaling,
    )
    c = compute_bytes(_torch_precision(precision) if kernels == "torch" else precision)
    rep, _ = moe_mla_bytes_per_token(
        spec, c, kernels=kernels, precision=precision, fp8_scaling=fp8_scaling
    )
    mla_shard = 0.0
    if (
        spec.mla is not None
    ):  # MLA's saved q, k, kv_b output and output minus the 4 a d_qk standing in
        m = spec.mla
        mla_shard = spec.heads * (m.qk_nope_head_dim + 2 * m.v_head_dim - 2 * m.qk_head_dim) * c
    traffic = 0.0
    if spec.moe is not None:
        traffic = spec.moe.top_k * 5 * spec.hidden * c + 8.0 * spec.moe.experts
    experts, expert_launches = (
        moe_expert_traffic(spec, c, fp32_probs=fp32_probs) if kernels == "fused" else (Terms(), 0.0)
    )
    launches = MOE_EXTRA_KERNELS * (spec.moe is not None) + MLA_EXTRA_KERNELS * (
        spec.mla is not None
    )
    return BlockTable(
        saved=base.saved + Terms(rep=float(sum(rep.values())), shard=mla_shard),
        saved_full_recompute=base.saved_full_recompute,
        scores_saved=base.scores_saved,
        traffic_fwd=base.traffic_fwd + Terms(rep=traffic) + experts,
        scores_traffic_fwd=base.scores_traffic_fwd,
        copy_traffic_fwd=base.copy_traffic_fwd + experts,
        kernels_fwd=base.kernels_fwd + launches + expert_launches,
    )


def mlp_inner_saved(gated: bool, c, lin, width, act_in=None):
    """What a Megatron MLP of inner width f keeps between its linears, per token: SwiGLU both fc1 halves (2 c f)
    or GeLU its input (c f), and fc2 its input (lin f: 1 byte under FP8). _megatron_block and module_sac.
    `act_in`: bytes per element of the activation's saved input when not c (1: Megatron-Core's
    activation_func_fp8_input_store keeps the SwiGLU input as float8_e4m3fn, fused_bias_swiglu.py)."""
    return ((2 if gated else 1) * (c if act_in is None else act_in) + lin) * width


def mlp_act_traffic(gated: bool, c, width):
    """Bytes the fused activation streams per token: SwiGLU reads 2 f and writes f, bias-GeLU reads and writes f."""
    return (3 if gated else 2) * c * width


def _megatron_block(
    spec: TransformerSpec,
    precision: str,
    *,
    flash: bool,
    dropout: bool,
    activation_fp8_input: bool = False,
    fp8_scaling: str = "tensorwise",
) -> BlockTable:
    """Korthikanti et al. 2022, Sec. 4.1, term by term (c = 2 under mixed precision):
    attention: LN-out c h + Q,K c (q + kv) + V c kv + softmax c a s + mask a s + dropout-out c a s
    + proj-in c q + mask h; MLP: fc1-in c h + act-in c f + fc2-in c f (+ c f gated) + mask h;
    norms: 2 x c h.  For GPT (q = kv = h, f = 4h, c = 2): 34 h + 5 a s.

    Under FP8 (Transformer Engine) each linear layer keeps, for its weight gradient, the FP8 cast of its
    input instead of the 16-bit tensor (TransformerEngine release_v1.12 and release_v2.4 module/linear.py and
    layernorm_linear.py save the quantized input, from 2.2 only its column-wise copy; Megatron-Core's SwiGLU keeps
    its 16-bit input): QKV in, fc1 in and fc2 in take 1 byte per element (NVFP4: 0.5625,
    quantized_bytes); the attention output stays in 16
    bits (TE's fused attention saves it for its own backward) and the projection adds its FP8 copy.

    `activation_fp8_input` (Megatron-Core's activation_func_fp8_input_store, SwiGLU only): the fused SwiGLU keeps
    its input cast to float8_e4m3fn, 2 f bytes instead of 2 c f, and writes that copy (2 f more streamed)."""
    c = compute_bytes(precision)
    h, q, kv, f, a = spec.hidden, spec.attn_width, spec.kv_width, spec.d_ffn, spec.heads
    mask = 1.0 if dropout else 0.0
    # a linear layer's saved input, per element: its quantized column-wise copy under FP8 (NVFP4's
    # 4-bit one under that recipe: TE's NVFP4 quantizer keeps the Hadamard-transformed copy for
    # wgrad)
    lin = quantized_bytes(fp8_scaling) if precision == "fp8" else c
    fp8_act = activation_fp8_input and spec.swiglu
    mlp_inner = mlp_inner_saved(
        spec.gated_mlp, c, lin, f, 1.0 if fp8_act else None
    )  # SwiGLU / GeLU in + fc2 in
    proj_in = (
        (c * q + (lin * q if lin != c else 0.0)) if flash else lin * q
    )  # flash keeps its 16-bit output
    rep = (
        c * h + lin * h + mask * h + c * h + lin * h + mask * h
    )  # LN1 in, QKV in, mask, LN2 in, fc1 in, mask
    shard = c * (q + kv) + c * kv + proj_in + mlp_inner  # Q, K, V, proj in, MLP inner
    if flash:
        shard += 4.0 * a  # log-sum-exp, fp32 per head
        # selective recomputation (Megatron-Core's checkpointed core attention) keeps Q, K, V and drops what the
        # kernel saved beyond them: the log-sum-exp and, under FP8, the 16-bit output, which the projection no
        # longer holds (it keeps its FP8 copy); in 16 bits the projection's saved input is that output itself
        scores = Terms(shard=4.0 * a + (c * q if lin != c else 0.0))
        scores_traffic = Terms()
    else:
        scores = Terms(
            seq=(2 * c + mask) * a if dropout else c * a
        )  # softmax out (+ mask + dropout out)
        # scale-mask-softmax reads + writes c per score; dropout reads c, writes c + 1 byte mask.
        scores_traffic = Terms(seq=(2 * c + (2 * c + 1) * (1 if dropout else 0)) * a)
    saved = Terms(rep=rep, shard=shard) + (Terms() if flash else scores)
    act = mlp_act_traffic(spec.gated_mlp, c, f) + (
        2.0 * f if fp8_act else 0.0
    )  # bias-GeLU r/w, SwiGLU r 2f w f
    bda = 3 * c + (1 if dropout else 0)  # bias-dropout-add: r x, r res, w y (+ mask)
    rope = unfused_rope_traffic(spec, c)
    traffic = Terms(rep=2 * c * h + bda * h + 2 * c * h + bda * h, shard=act) + scores_traffic
    return BlockTable(
        saved=saved,
        saved_full_recompute=Terms(rep=c * h),
        scores_saved=scores,
        traffic_fwd=traffic + rope,
        scores_traffic_fwd=scores_traffic,
        copy_traffic_fwd=rope,
        kernels_fwd=14.0 + UNFUSED_ROPE_LAUNCHES * (rope.shard > 0),
    )


EAGER_HOST_OPS_PER_KERNEL = 2.0
"""Host operators module code issues per kernel it launches, as the eager table counts them
(_eager_block): the kernel's own operator plus the views, transposes, casts and autograd
bookkeeping around it. The H100 fit of `dispatch_us_per_op` (benchmarks/calibrate.py, the 42
eager steps) was made with this count, so host time per kernel of eager module code is 2 x
dispatch_us_per_op."""

LEGACY_MEGATRON_KERNELS = {
    "norms": 2,
    "qkv_gemm": 1,
    "mlp_gemms_and_proj": 3,
    "bias_dropout_add": 2,
}
"""Kernels of one forward of legacy Megatron-LM's ParallelTransformerLayer outside its attention
core and MLP activation, as Megatron-DeepSpeed runs it (megatron/model/transformer.py and
core/tensor_parallel/layers.py at microsoft/Megatron-DeepSpeed b4fcd6c5, 2023-09): two apex fused
norms (FusedLayerNorm, or MixedFusedRMSNorm under --normalization rmsnorm: one kernel either
way); the QKV ColumnParallelLinear's matmul; the output projection, fc1 and fc2 matmuls; the two
TorchScript bias-dropout-adds (the projection's and fc1's biases are skipped into the next
kernel). The bias adds that run as kernels of their own, the activation, rotary embeddings and
grouped-query copies depend on the block (legacy_megatron_launches). Tensor-parallel all-reduces
are counted apart (cost_models.host)."""

LEGACY_ROPE_KERNELS = 10
"""Kernels of one apply_rotary_pos_emb at b4fcd6c5 (megatron/model/rotary_pos_embedding.py; once
for q, once for k): cos, its cast, mul, neg and cat of rotate_half, sin, its cast, mul, add, and
the final cat with the untouched part (the pipeline path keeps the frequencies in fp32)."""

LEGACY_GQA_KERNELS = 3
"""Grouped-query attention at b4fcd6c5: a separate key-value matmul beside the query's, and
repeat_kv's reshape of the expanded k and v (two copies), on the unfused and the flash path."""


def legacy_megatron_launches(spec: TransformerSpec, *, flash: bool, dropout: bool) -> float:
    """Host operators of one forward of legacy Megatron's dense ParallelTransformerLayer
    (LEGACY_MEGATRON_KERNELS), counted as eager module code is (EAGER_HOST_OPS_PER_KERNEL per
    kernel): its module code wraps Megatron's fused kernels in views, transposes, RNG-tracker
    forks and autograd Functions. The attention core (CoreAttention.forward): unfused, baddbmm
    into the preallocated buffer, the fused scale-mask-softmax, the attention dropout (under the
    RNG tracker), bmm with V and the permute's contiguous copy; with flash attention, the three
    q, k, v rearrange copies, the kernel and the output's copy. The QKV bias add is its own
    kernel (LinearWithGradAccumulationAndAsyncCommunication adds it after the matmul), and so is
    fc2's (its RowParallelLinear keeps skip_bias_add False); with grouped queries the query and
    key-value linears add one each. The activation: the TorchScript bias-GeLU (F.gelu alone
    without biases), SwiGLU's silu and mul (a plain closure, not scripted) after fc1's bias add;
    the layer offers no other activation but squared ReLU (relu and pow), so another non-gated
    activation (T5's ReLU) is counted as one kernel after the bias add. Rotary embeddings
    (LEGACY_ROPE_KERNELS) and grouped queries (LEGACY_GQA_KERNELS) where the block has them."""
    core = 5.0 if flash else 4.0 + (1.0 if dropout else 0.0)
    grouped = spec.n_kv_heads < spec.heads
    fused_bias_gelu = not spec.gated_mlp and spec.activation.startswith("gelu")
    activation = 2.0 if spec.gated_mlp else 1.0
    fc1_bias_add = 1.0 if spec.mlp_bias and not fused_bias_gelu else 0.0
    qkv_bias_adds = (2.0 if grouped else 1.0) if spec.qkv_bias else 0.0  # query, key-value
    bias_adds = qkv_bias_adds + fc1_bias_add + (1.0 if spec.mlp_bias else 0.0)  # fc2's
    rope = 2.0 * LEGACY_ROPE_KERNELS if spec.position == "rope" else 0.0
    gqa = LEGACY_GQA_KERNELS if grouped else 0.0
    kernels = sum(LEGACY_MEGATRON_KERNELS.values()) + core + activation + bias_adds + rope + gqa
    return kernels * EAGER_HOST_OPS_PER_KERNEL


def _eager_block(
    spec: TransformerSpec,
    precision: str,
    *,
    dropout: bool,
    python_gelu: bool,
    fused_norm: bool = False,
) -> BlockTable:
    """HF-style eager block (see module docstring); c = math dtype bytes, r = residual dtype bytes
    (fp32 under autocast, as the embedding output is fp32), o = dtype of ops autocast runs in fp32.
    `fused_norm`: each RMSNorm is one fused kernel (torchtitan's norm_type fused_rmsnorm, a Triton kernel in
    torchtitan/models/norms.py, TritonFusedRMSNorm): it reads x and writes y once, and keeps only x and the
    fp32 row statistic rstd (4 bytes per token, left out) for its backward."""
    amp = precision.startswith("amp")
    c = compute_bytes(precision)
    r = 4 if (amp or precision == "fp32") else 2
    h, q, kv, f, a = spec.hidden, spec.attn_width, spec.kv_width, spec.d_ffn, spec.heads
    calls_attn = 1 if _fused_qkv(spec) else 3
    calls_mlp = 2 if spec.gated_mlp else 1

    # Norms (each of the two): saved and streamed bytes per hidden element.
    if spec.norm == "rmsnorm" and fused_norm:
        norm_saved, norm_traffic, norm_out, norm_kernels = r, 2 * r, r, 1
    elif (
        spec.norm == "rmsnorm"
    ):  # HF LlamaRMSNorm: x.to(fp32); pow(2).mean; x * rsqrt; weight * x.to(dtype)
        norm_saved = 4 + r  # fp32 x (the residual when r == 4) + normalized x
        norm_traffic = 8 + 4 + 8 + 2 * r + (0 if r == 4 else 2 * (r + 4))
        norm_out = r
        norm_kernels = 6 + (0 if r == 4 else 2)
    else:  # fused native_layer_norm (fp32 under autocast): saves its input
        norm_out = 4 if amp else c
        norm_saved = r
        norm_traffic = r + norm_out
        norm_kernels = 1

    def proj_inputs(calls: int) -> tuple[float, float]:
        """Saved and streamed bytes per hidden element for the projections reading a norm output."""
        if amp:  # autocast casts the activation per call (only weights are cached)
            return 2.0 * calls, (norm_out + 2.0) * calls
        return float(norm_out), 0.0

    pin_attn_saved, pin_attn_traffic = proj_inputs(calls_attn)
    pin_mlp_saved, pin_mlp_traffic = proj_inputs(calls_mlp)

    rep_saved = (
        2 * norm_saved + pin_attn_saved + pin_mlp_saved + (2.0 if dropout else 0.0)
    )  # per h; 2 masks
    shard_saved = c * (q + 2 * kv) + c * q + 4.0 * a  # SDPA saves q, k, v, out, logsumexp
    o = 4 if amp else c  # dtype of autocast-fp32 ops' outputs
    if spec.gated_mlp:  # gate (silu in), silu out, up (mul ins), product (down in)
        shard_saved += 4 * c * f
        mlp_traffic = 2 * c * f + 3 * c * f
        mlp_kernels = 2
    elif python_gelu:  # 0.5 x (1 + tanh(k (x + 0.044715 x^3))) op by op; pow autocasts to fp32
        shard_saved += (o + o + c + o + 2) * f if amp else 5 * c * f
        mlp_traffic = 76 * f if amp else 18 * c * f
        mlp_kernels = 10 if amp else 8
    else:  # fused F.gelu / silu / relu: saves its input; fc2 saves the output
        shard_saved += 2 * c * f
        mlp_traffic = 2 * c * f
        mlp_kernels = 1

    rope_traffic = 0.0
    rope_kernels = 0
    if (
        spec.position == "rope"
    ):  # q*cos + rotate_half(q)*sin in the residual dtype, then SDPA's cast
        rope_traffic = (5 * c + 5 * o + (o + 2 if amp else 0)) * (q + kv)
        rope_kernels = 14
    drop_traffic = (2 * c + 1) * 2 if dropout else 0.0
    residual_traffic = 2 * (r + c + r)
    traffic = Terms(
        rep=(
            2 * norm_traffic + pin_attn_traffic + pin_mlp_traffic + drop_traffic + residual_traffic
        )
        * h,
        shard=mlp_traffic + rope_traffic,
    )
    kernels = (
        2 * norm_kernels
        + (calls_attn + calls_mlp if amp else 0)
        + calls_attn
        + 1
        + 1
        + (3 if spec.gated_mlp else 2)
        + mlp_kernels
        + rope_kernels
        + 2
        + (2 if dropout else 0)
    ) * EAGER_HOST_OPS_PER_KERNEL
    return BlockTable(
        saved=Terms(rep=rep_saved * h, shard=shard_saved),
        saved_full_recompute=Terms(rep=r * h),
        traffic_fwd=traffic,
        kernels_fwd=kernels,
    )


def upcast_cross_entropy_bytes(c: float) -> float:
    """Bytes per vocabulary entry that torch's cross_entropy streams forward on logits of `c` bytes
    under autocast (cross_entropy is on autocast's fp32 list): the fp32 copy (read c, write 4, none
    for fp32 logits), then log_softmax (log_softmax_bytes) and nll_loss's gather (one entry per
    row, negligible). The forward of head_table's upcast loss, and what each of a trainer's train
    metrics costs under autocast (metric_traffic)."""
    return fp32_copy_bytes(c) + log_softmax_bytes(4.0)


def fp32_copy_bytes(c: float) -> float:
    """Bytes per element of casting `c`-byte values to fp32 (read c, write 4); none for fp32."""
    return (c + 4.0) if c != 4 else 0.0


def under_autocast(precision: str) -> bool:
    """Whether the run's ops outside the modules run under torch.autocast: the amp-* precisions,
    and FP8 recipes, whose fp8_autocast sits inside it."""
    return precision.startswith("amp") or precision == "fp8"


def log_softmax_bytes(c: float) -> float:
    """Bytes per entry torch's log_softmax streams forward over rows of `c`-byte values longer than
    its cached kernels take (a vocabulary row: PyTorch's SoftMax.cu keeps a row in shared memory
    only under 48 KB and in registers only for short rows): cunn_SoftMaxForward reads the row for
    its max, again for the sum of exponentials, and a third time to write the result (3 c + c).
    A vocabulary shard under 48 KB (a small vocabulary split over many tp ranks) would take the
    one-read kernel; no costed model has one.
    Its backward (cunn_SoftMaxBackward) streams as much: the incoming gradient twice (for the row's
    sum, then with the output) and the output once, writing the input's gradient."""
    return 4.0 * c


def metric_bytes_per_entry(precision: str) -> float:
    """One train metric's cross_entropy, per vocabulary entry: under autocast (amp-*, and FP8
    recipes, which run inside it) the fp32 copy and its log_softmax (upcast_cross_entropy_bytes);
    without it log_softmax on the logits' own dtype (log_softmax_bytes)."""
    c = compute_bytes(precision)
    return upcast_cross_entropy_bytes(c) if under_autocast(precision) else log_softmax_bytes(c)


def metric_traffic(spec: TransformerSpec, precision: str, metrics: int) -> Terms:
    """Per token, the bytes `metrics` cross-entropy train metrics stream over the logits after each
    micro-batch's backward, outside autograd (Composer's trainer updates every train metric on
    every micro-batch, Trainer._train_microbatch -> _eval_train_metrics, under the run's autocast;
    llm-foundry's MPT logs LanguageCrossEntropy and LanguagePerplexity, each a full
    torch.nn.CrossEntropyLoss of the logits, composer/metrics/nlp.py), run in `precision`.
    Vocab-parallel: V / tp."""
    return Terms(shard=metrics * metric_bytes_per_entry(precision) * spec.vocab)


def metric_transient(spec: TransformerSpec, precision: str, metrics: int) -> Terms:
    """Per token, the most a train metric holds at once after the backward (metric_traffic): the
    logits the trainer still references (its state.outputs, c V), under autocast their fp32 copy
    (4 V, none for fp32 logits) and the log_softmax output being written (4 V under autocast, else
    c V); nothing without metrics."""
    c = compute_bytes(precision)
    autocast = under_autocast(precision)
    upcast = 4.0 if autocast and c != 4 else 0.0
    out = 4.0 if autocast else c
    return Terms(shard=(c + upcast + out) * spec.vocab * (metrics > 0))


def head_table(
    spec: TransformerSpec, precision: str, kernels: str, loss: str | None = None
) -> HeadTable:
    """Final norm, LM head and cross-entropy on the last stage, per token (V split over tp:
    Megatron's vocab-parallel head and loss). The norm and head follow `kernels`; the logits and the
    loss follow `loss` (frameworks.LOSS_KERNELS; None: vocab_parallel for fused kernels, else upcast):

    upcast (HF ForCausalLMLoss, torchtitan): logits in the math dtype, `.float()` upcast, log_softmax
      saves its fp32 output; at the start of backward the saved output, the loss grad and the
      log_softmax input grad coexist: 12 V bytes per token (4 V each).
    vocab_parallel (Megatron): 16-bit logits (c V) are upcast to fp32 and the vocab-parallel
      cross-entropy keeps exp(logits) in place: (c + 4) V.
    fused (flash-attn's xentropy kernel, llm-foundry's default): the 16-bit logits are kept for the
      backward (c V), which writes their gradient beside them (c V, inplace_backward off): 2 c V at the
      peak; the row statistics (4 bytes per token) are negligible.
    native (torch's cross_entropy on the 16-bit logits: log_softmax then nll_loss, no upcast; NeMo
      AutoModel's MaskedCrossEntropy(fp32_upcast=False)): log_softmax saves its 16-bit output (c V); at the
      start of backward the logits the training loop still holds (AutoModel's train_ft keeps `out` through
      `backward()`), the saved output, nll_loss's gradient and log_softmax's input gradient coexist: 4 c V
      (torch aten log_softmax / _log_softmax_backward_data keep the input dtype; the row statistics are
      accumulated in fp32 registers, not stored).
    inplace (Transformer Engine's parallel_cross_entropy, Megatron-Core's cross_entropy_fusion_impl "te"; TE
      pytorch/cross_entropy.py and triton/cross_entropy.py): the forward's first kernel reads the 16-bit logits
      for each row's max and sum (all-reduced over tp), the second writes the loss and the gradient into the
      logits themselves, which are what autograd keeps; the backward scales them in place by the incoming
      gradient. c V at both moments; 3 c V streamed forward, 2 c V backward, three kernels.
    """
    c = compute_bytes(precision)
    h, V = spec.hidden, spec.vocab
    amp = precision.startswith("amp")
    if loss is None:
        loss = "vocab_parallel" if kernels == "fused" else "upcast"
    if kernels == "torch":
        precision = _torch_precision(precision)
        c, amp = compute_bytes(precision), False
    if kernels == "fused":
        saved = Terms(rep=2 * c * h)
        norm_fwd, norm_bwd = Terms(rep=2 * c * h), Terms(rep=4 * c * h)
        launches = 4.0
    else:
        r = 4 if (amp or precision == "fp32") else 2
        norm_saved = (4 + r) if spec.norm == "rmsnorm" else r
        norm_out = r if spec.norm == "rmsnorm" else (4 if amp else c)
        saved = Terms(rep=norm_saved * h + (2 if amp else norm_out) * h)
        if (
            kernels == "torch"
        ):  # final norm as in _torch_block (fp32 copy, normalized, stats), LM head input c
            rms = spec.norm == "rmsnorm"
            norm_in = 4 if rms else r
            saved = Terms(
                rep=(h * norm_in + h * 4 * rms + 4 * (1 if rms else 2)) * spec.final_norm + h * c
            )
        norm_fwd = Terms(rep=(r + norm_out + (norm_out + 2 if amp else 0)) * h)
        norm_bwd = Terms(rep=2 * (r + norm_out) * h)
        launches = 8.0
    if loss == "vocab_parallel":
        peak = fwd_end = Terms(shard=(c + 4.0) * V)
        logits_fwd, logits_bwd, launches = (
            Terms(shard=(c + 4 + 16) * V),
            Terms(shard=(8 + 4 + c) * V),
            launches + 8,
        )
    elif loss == "upcast":
        upcast = fp32_copy_bytes(c)
        peak, fwd_end = Terms(shard=12.0 * V), Terms(shard=(8.0 + (c if c != 4 else 0)) * V)
        logits_fwd, logits_bwd = (
            Terms(shard=upcast_cross_entropy_bytes(c) * V),
            Terms(shard=(4.0 + log_softmax_bytes(4.0) + upcast) * V),
        )
        launches += 8
    elif loss == "fused":
        peak, fwd_end = Terms(shard=2.0 * c * V), Terms(shard=c * V)
        logits_fwd, logits_bwd, launches = (
            Terms(shard=c * V),
            Terms(shard=2.0 * c * V),
            launches + 2,
        )
    elif loss == "native":
        # forward: log_softmax on the c-byte logits; backward: nll_loss's gradient written (c V),
        # then log_softmax's backward (log_softmax_bytes: each streams 4 c V over vocabulary rows)
        peak, fwd_end = Terms(shard=4.0 * c * V), Terms(shard=2.0 * c * V)
        logits_fwd, logits_bwd, launches = (
            Terms(shard=log_softmax_bytes(c) * V),
            Terms(shard=(c + log_softmax_bytes(c)) * V),
            launches + 5,
        )
    elif loss == "inplace":
        peak = fwd_end = Terms(shard=c * V)
        logits_fwd, logits_bwd, launches = (
            Terms(shard=3.0 * c * V),
            Terms(shard=2.0 * c * V),
            launches + 3,
        )
    else:
        raise ValueError(
            f"loss must be one of vocab_parallel, upcast, fused, native, inplace, not {loss!r}"
        )
    return HeadTable(
        saved=saved,
        logits_peak=peak,
        logits_fwd_end=fwd_end,
        traffic_fwd=norm_fwd + logits_fwd,
        traffic_bwd=norm_bwd + logits_bwd,
        kernels=launches,
    )


def embedding_saved(spec: TransformerSpec, precision: str, *, dropout: bool) -> Terms:
    """First stage: the embedding dropout mask (1 byte per element) when dropout is on. (The int64
    token ids, 8 bytes per token, and the rotary tables, 2 s d per micro-batch, are left out: well
    under 1% of one block's activations for any model the planner plans.)"""
    return Terms(rep=float(spec.hidden) if dropout else 0.0)


def loss_saved(spec: TransformerSpec, loss: str = "upcast", precision: str = "amp-bf16") -> Terms:
    """What cross-entropy keeps for its backward: the fp32 log-softmax (upcast) or exp (vocab_parallel) of
    the vocab-parallel logits, 4 V / tp per token; a fused kernel keeps the 16-bit logits, the native
    cross_entropy its 16-bit log-softmax and the in-place kernel the gradient it wrote over the logits, c V / tp
    (head_table); part of HeadTable.logits_peak."""
    if loss in ("fused", "native", "inplace"):
        return Terms(shard=compute_bytes(precision) * spec.vocab)
    return Terms(shard=4.0 * spec.vocab)
