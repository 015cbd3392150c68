"""A plain decoder-only transformer built from a `TransformerSpec` (GPT-2 and Llama families).

Nothing here knows about parallelism (torchtitan's split between model and `parallelize`): the
executor applies tensor/pipeline/data parallelism from outside by module name.

Module names (stable; the executor's TP plan and the profiler refer to them):
  tok_embeddings, pos_embeddings (learned positions only), layers.<i>.attention_norm,
  layers.<i>.attention.{wq,wk,wv,wo}, layers.<i>.ffn_norm, layers.<i>.feed_forward.{w1,w2,w3},
  norm, output.
Mixture-of-experts blocks (spec.moe, from block moe.first_dense_layers on; planner.spec.MoESpec):
  layers.<i>.feed_forward.router, layers.<i>.feed_forward.experts.<e>.{w1,w2,w3} (one module per
  expert, so expert parallelism can shard them by name), layers.<i>.feed_forward.shared_experts.
  {w1,w2,w3} (the S shared experts as one MLP of width S f_s, as Megatron-Core builds them) and
  layers.<i>.feed_forward.shared_gate (Qwen2-MoE). Routing is dropless: every token goes to its
  top-k experts (softmax or sigmoid scores, DeepSeek-V3's group limit and balancing bias for the
  choice only), each expert multiplies exactly the rows routed to it, and the weighted outputs are
  added back (so FlopCounterMode sees 2 t k x the expert GEMM weights). A capacity factor is not
  modelled here (the reference never drops tokens). MoE routing reads the routing result on the
  host (data-dependent shapes): the MoE forward needs a real device, not meta.
Multi-head latent attention (spec.mla): layers.<i>.attention.{wq_a,q_norm,wq_b | wq, wkv_a,kv_norm,
  wkv_b,wo} (DeepSeek-V3 report Sec. 2.1.1; the rotary key part is one head shared by all).
gpt-oss details: attention sinks (layers.<i>.attention.sinks, one logit per head added to the
softmax denominator) and sliding windows (spec.window_layers) through an additive SDPA mask; its
clamped SwiGLU is the plain SwiGLU here (same shapes and FLOPs). MTP modules are not built.
Attention reshapes with -1 heads so that a column-sharded wq/wk/wv works unchanged; grouped-query
attention passes K/V with their own (fewer) heads to SDPA (`enable_gqa`), so no repeated copy of
K/V is made or saved.

Activation recomputation (what the executor and the profiler tests use): `model.set_recompute(mode)`
or `apply_recompute(model, mode)` with mode
  - "none": nothing recomputed;
  - "selective": only the attention core (the SDPA call) is checkpointed, as in Korthikanti et al.
    2022 Sec. 5 (with a flash kernel this frees only its logsumexp: Q, K, V and the output are kept);
  - "full": every block is checkpointed (its input is kept, the rest recomputed in backward).
Checkpointing is torch.utils.checkpoint non-reentrant, so it composes with FSDP2, TP and pipelining
(docs/executor-notes.md); it is active only while autograd records (grad enabled).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.spec import TransformerSpec

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def _norm(spec: TransformerSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden, eps=1e-6)
    return nn.LayerNorm(spec.hidden, eps=1e-5)


def rope_cos_sin(
    seq: int, head_dim: int, theta: float = 10000.0, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position tables (Su et al. 2021, RoFormer, eq. 34), shape (seq, head_dim)."""
    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    )
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, spec: TransformerSpec, *, window: int = 0):
        super().__init__()
        self.head_dim = spec.d_head
        self.rep = spec.heads // spec.n_kv_heads
        self.causal = spec.causal
        self.window = window
        """Sliding window in tokens for this block (0: full attention)."""
        self.recompute_core = False
        """Checkpoint the SDPA call (selective recomputation); set by Transformer.set_recompute."""
        self.wq = nn.Linear(spec.hidden, spec.heads * self.head_dim, bias=spec.qkv_bias)
        self.wk = nn.Linear(spec.hidden, spec.n_kv_heads * self.head_dim, bias=spec.qkv_bias)
        self.wv = nn.Linear(spec.hidden, spec.n_kv_heads * self.head_dim, bias=spec.qkv_bias)
        self.wo = nn.Linear(spec.heads * self.head_dim, spec.hidden, bias=spec.out_bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if spec.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(spec.heads)) if spec.attention_sinks else None

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        if (
            self.q_norm is not None
        ):  # over head_dim, before the transpose (as Hugging Face's Qwen3 and
            q, k = (
                self.q_norm(q),
                self.k_norm(k),
            )  # torchtitan's): SDPA's output stays a view for W_O
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope[0][:s], rope[1][:s]
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        return self.wo(_attend(self, q, k, v).transpose(1, 2).reshape(b, s, -1))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Look SDPA up at call time so a profiler can route it to another kernel.
        if self.sinks is None and not self.window:
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=self.causal, enable_gqa=self.rep > 1
            )
        return _masked_core(
            q, k, v, causal=self.causal, window=self.window, sinks=self.sinks, gqa=self.rep > 1
        )


def _attend(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The module's attention core, checkpointed under selective recomputation."""
    if module.recompute_core and torch.is_grad_enabled():
        return checkpoint(module._core, q, k, v, use_reentrant=False)
    return module._core(q, k, v)


def _masked_core(q, k, v, *, causal: bool, window: int, sinks, gqa: bool) -> torch.Tensor:
    """SDPA with an additive mask: causal (and a band of `window` keys, HF's kv > q - w), and gpt-oss
    sinks as one more key of zero value whose score is the head's sink logit (it only adds exp(sink)
    to the softmax denominator; OpenAI 2025, gpt-oss model card Sec. 2.2)."""
    s_q, s_k = q.shape[-2], k.shape[-2]
    i = torch.arange(s_q, device=q.device)[:, None]
    j = torch.arange(s_k, device=q.device)[None, :]
    allowed = (j <= i) if causal else torch.ones(s_q, s_k, dtype=torch.bool, device=q.device)
    if window:
        allowed = allowed & (j > i - window)
    mask = torch.zeros(s_q, s_k, dtype=q.dtype, device=q.device).masked_fill(
        ~allowed, float("-inf")
    )
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    b, heads = q.shape[0], q.shape[1]
    k = torch.cat([k, k.new_zeros(*k.shape[:-2], 1, k.shape[-1])], dim=-2)
    v = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], dim=-2)
    sink_column = sinks.to(q.dtype).view(1, heads, 1, 1).expand(b, heads, s_q, 1)
    mask = torch.cat([mask.expand(b, heads, s_q, s_k), sink_column], dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class LatentAttention(nn.Module):
    """Multi-head latent attention (planner.spec.MLASpec; DeepSeek-V3 report Sec. 2.1.1, eq. 1-11)."""

    def __init__(self, spec: TransformerSpec):
        super().__init__()
        m, h, a = spec.mla, spec.hidden, spec.heads
        self.mla, self.heads, self.causal = m, a, spec.causal
        self.recompute_core = False
        """Checkpoint the SDPA call (selective recomputation); set by Transformer.set_recompute."""
        if m.q_lora_rank:
            self.wq_a = nn.Linear(h, m.q_lora_rank, bias=spec.qkv_bias)
            self.q_norm = nn.RMSNorm(m.q_lora_rank, eps=1e-6)
            self.wq_b = nn.Linear(m.q_lora_rank, a * m.qk_head_dim, bias=False)
        else:
            self.wq = nn.Linear(h, a * m.qk_head_dim, bias=spec.qkv_bias)
        self.wkv_a = nn.Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias=spec.qkv_bias)
        self.kv_norm = nn.RMSNorm(m.kv_lora_rank, eps=1e-6)
        self.wkv_b = nn.Linear(m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.wo = nn.Linear(a * m.v_head_dim, h, bias=spec.out_bias)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        # built as (b, s, heads, d) and transposed last, as Attention does, so that the kernel's output
        # transposes back without a copy
        b, s, _ = x.shape
        m = self.mla
        q = self.wq_b(self.q_norm(self.wq_a(x))) if m.q_lora_rank else self.wq(x)
        q_nope, q_rope = q.view(b, s, -1, m.qk_head_dim).split(
            [m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1
        )
        latent, k_rope = self.wkv_a(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).view(b, s, -1, m.qk_nope_head_dim + m.v_head_dim)
        k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        k_rope = k_rope.view(b, s, 1, m.qk_rope_head_dim)
        if rope is not None:
            cos, sin = rope[0][:s, None, :], rope[1][:s, None, :]
            q_rope, k_rope = _apply_rope(q_rope, cos, sin), _apply_rope(k_rope, cos, sin)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        k = torch.cat(
            [k_nope, k_rope.expand(b, s, k_nope.shape[2], m.qk_rope_head_dim)], dim=-1
        ).transpose(1, 2)
        return self.wo(_attend(self, q, k, v.transpose(1, 2)).transpose(1, 2).reshape(b, s, -1))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class FeedForward(nn.Module):
    def __init__(self, spec: TransformerSpec, width: int | None = None):
        super().__init__()
        f = spec.d_ffn if width is None else width
        self.act = _ACTIVATIONS[spec.activation]
        self.gated = spec.gated_mlp
        self.w1 = nn.Linear(spec.hidden, f, bias=spec.mlp_bias)
        self.w2 = nn.Linear(f, spec.hidden, bias=spec.mlp_bias)
        self.w3 = nn.Linear(spec.hidden, f, bias=spec.mlp_bias) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(h)


class MoEFeedForward(nn.Module):
    """Router + routed experts (+ shared experts), dropless (module docstring; planner.spec.MoESpec)."""

    def __init__(self, spec: TransformerSpec):
        super().__init__()
        moe = self.moe = spec.moe
        self.router = nn.Linear(spec.hidden, moe.experts, bias=moe.router_bias)
        self.experts = nn.ModuleList(
            [FeedForward(spec, moe.expert_ffn) for _ in range(moe.experts)]
        )
        shared = moe.shared_experts * moe.d_shared_ffn
        self.shared_experts = FeedForward(spec, shared) if shared else None
        self.shared_gate = nn.Linear(spec.hidden, 1, bias=False) if moe.shared_expert_gate else None
        if (
            moe.aux_free_bias
        ):  # DeepSeek-V3's balancing bias: changes the choice only, not a parameter
            self.register_buffer("expert_bias", torch.zeros(moe.experts))
        else:
            self.expert_bias = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert index, gate weight) of each token's top-k experts, shapes (t, k): Mixtral's softmax
        over the top-k logits (= full softmax renormalized, Qwen3; not renormalized for Qwen2-MoE),
        DeepSeek-V3's sigmoid scores with the balancing bias and group limit in the choice only,
        weights renormalized and scaled (report Sec. 2.1.2, eq. 12-16)."""
        moe = self.moe
        logits = self.router(x)
        scores = (
            logits.softmax(dim=-1, dtype=torch.float32)
            if moe.router == "softmax"
            else logits.float().sigmoid()
        )
        with (
            torch.no_grad()
        ):  # the choice is not differentiable; only the chosen scores carry gradients
            choice = scores if self.expert_bias is None else scores + self.expert_bias
            if moe.groups_per_token and moe.expert_groups > 1:
                # DeepSeek-V3's node-limited routing: rank groups by their two best scores, keep the best
                grouped = choice.view(x.shape[0], moe.expert_groups, -1)
                group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
                keep = torch.zeros_like(group_score, dtype=torch.bool)
                keep.scatter_(1, group_score.topk(moe.groups_per_token, dim=-1).indices, True)
                choice = choice.masked_fill(
                    ~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf")
                )
            index = choice.topk(moe.top_k, dim=-1).indices
        weight = scores.gather(1, index)
        if moe.normalize_top_k:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        return index, (weight * moe.routed_scaling).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        index, weight = self.route(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(index == e)
            if token.numel():
                out = out.index_add(0, token, expert(x[token]) * weight[token, slot, None])
        return self.add_shared(x, out).view(shape)

    def add_shared(self, x, out):
        """`out` plus the always-active shared experts' output on `x` (sigmoid-gated where the model gates it)."""
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out


class Block(nn.Module):
    def __init__(self, spec: TransformerSpec, layer: int = 0):
        super().__init__()
        self.attention_norm = _norm(spec)
        if spec.mla is not None:
            self.attention = LatentAttention(spec)
        else:
            self.attention = Attention(
                spec, window=spec.sliding_window if spec.windowed(layer) else 0
            )
        self.ffn_norm = _norm(spec)
        self.feed_forward = MoEFeedForward(spec) if spec.is_moe_layer(layer) else FeedForward(spec)
        self.recompute_block = False
        """Checkpoint the whole block (full recomputation); set by Transformer.set_recompute."""

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        if self.recompute_block and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        return self._forward(x, rope)

    def _forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Decoder-only LM. `forward(tokens)` returns logits; layers may be None-d out by a pipeline
    stage (torchtitan's convention), so every submodule is optional at run time."""

    def __init__(self, spec: TransformerSpec):
        super().__init__()
        if spec.encoder_layers:
            raise NotImplementedError("encoder-decoder models have no reference implementation")
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings = (
            nn.Embedding(spec.n_positions, spec.hidden) if spec.position == "learned" else None
        )
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.layers)})
        self.norm = _norm(spec)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self._rope_len = spec.seq if spec.position == "rope" else 0
        self.positions: torch.Tensor | None = None
        """Sequence positions of the tokens this module sees (context parallelism gives each rank
        chunks of the sequence, planner.executor.context); None: 0 .. s-1."""

    def set_recompute(self, mode: str) -> "Transformer":
        """Activation recomputation for every block: "none", "selective" (attention core) or "full"."""
        if mode not in RECOMPUTE_MODES:
            raise ValueError(f"recompute mode must be one of {RECOMPUTE_MODES}, not {mode!r}")
        for block in self.layers.values():
            if block is None:
                continue
            block.recompute_block = mode == "full"
            block.attention.recompute_core = mode == "selective"
        return self

    def init_weights(self, seed: int = 0) -> None:
        """Deterministic GPT-2 style init (N(0, 0.02), residual projections scaled by 1/sqrt(2L))."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if p.dim() == 1:
                    p.copy_(
                        torch.ones_like(p) if name.endswith("norm.weight") else torch.zeros_like(p)
                    )
                else:
                    std = (
                        0.02 / math.sqrt(2 * max(1, self.spec.layers))
                        if name.endswith(("wo.weight", "w2.weight"))
                        else 0.02
                    )
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        s = h.shape[1]
        positions = getattr(
            self, "positions", None
        )  # a pipeline stage module may predate the attribute
        if positions is not None:
            positions = positions.to(h.device)
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(
                torch.arange(s, device=h.device) if positions is None else positions
            )
        rope_dim = self.spec.mla.qk_rope_head_dim if self.spec.mla is not None else self.spec.d_head
        rope = None
        if self.spec.position == "rope":
            if positions is None:
                rope = rope_cos_sin(s, rope_dim, self.spec.rope_theta, device=h.device)
            else:  # the table's rows at the given positions: the same values as the full table's
                cos, sin = rope_cos_sin(
                    int(positions.max()) + 1, rope_dim, self.spec.rope_theta, device=h.device
                )
                rope = (cos[positions], sin[positions])
        if rope is not None:
            rope = (rope[0].to(h.dtype), rope[1].to(h.dtype))
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


RECOMPUTE_MODES = ("none", "selective", "full")


def apply_recompute(model: Transformer, mode: str) -> Transformer:
    """torchtitan-style `apply_ac`: set the recomputation mode of every block (see module docstring)."""
    return model.set_recompute(mode)


def build_model(
    spec: TransformerSpec,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int | None = 0,
) -> Transformer:
    """Build the reference model; on device='meta' no memory is allocated and no init runs."""
    with torch.device(device):
        model = Transformer(spec).to(dtype=dtype)
    if seed is not None and str(device) != "meta":
        model.init_weights(seed)
    return model


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, logits upcast to fp32 as Megatron and Hugging Face do."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))
