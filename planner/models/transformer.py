"""A plain decoder-only transformer built from a `TransformerSpec` (GPT-2 and Llama families).

Nothing here knows about parallelism (torchtitan's split between model and `parallelize`): the
executor applies tensor/pipeline/data parallelism from outside by module name.

Module names (stable; the executor's TP plan and the profiler refer to them):
  tok_embeddings, pos_embeddings (learned positions only), layers.<i>.attention_norm,
  layers.<i>.attention.{wq,wk,wv,wo}, layers.<i>.ffn_norm, layers.<i>.feed_forward.{w1,w2,w3},
  norm, output.
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

_ACTIVATIONS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
                "relu": F.relu}


def _norm(spec: TransformerSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden, eps=1e-6)
    return nn.LayerNorm(spec.hidden, eps=1e-5)


def rope_cos_sin(seq: int, head_dim: int, theta: float = 10000.0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position tables (Su et al. 2021, RoFormer, eq. 34), shape (seq, head_dim)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.head_dim = spec.d_head
        self.rep = spec.heads // spec.n_kv_heads
        self.causal = spec.causal
        self.recompute_core = False
        """Checkpoint the SDPA call (selective recomputation); set by Transformer.set_recompute."""
        self.wq = nn.Linear(spec.hidden, spec.heads * self.head_dim, bias=spec.qkv_bias)
        self.wk = nn.Linear(spec.hidden, spec.n_kv_heads * self.head_dim, bias=spec.qkv_bias)
        self.wv = nn.Linear(spec.hidden, spec.n_kv_heads * self.head_dim, bias=spec.qkv_bias)
        self.wo = nn.Linear(spec.heads * self.head_dim, spec.hidden, bias=spec.out_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope[0][:s], rope[1][:s]
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if self.recompute_core and torch.is_grad_enabled():
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Look SDPA up at call time so a profiler can route it to another kernel.
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.rep > 1)


class FeedForward(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.act = _ACTIVATIONS[spec.activation]
        self.gated = spec.gated_mlp
        self.w1 = nn.Linear(spec.hidden, spec.d_ffn, bias=spec.mlp_bias)
        self.w2 = nn.Linear(spec.d_ffn, spec.hidden, bias=spec.mlp_bias)
        self.w3 = nn.Linear(spec.hidden, spec.d_ffn, bias=spec.mlp_bias) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(h)


class Block(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        self.feed_forward = FeedForward(spec)
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
        self.pos_embeddings = nn.Embedding(spec.n_positions, spec.hidden) if spec.position == "learned" else None
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm = _norm(spec)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self._rope_len = spec.seq if spec.position == "rope" else 0

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
                    p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.zeros_like(p))
                else:
                    std = 0.02 / math.sqrt(2 * max(1, self.spec.layers)) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        s = h.shape[1]
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(torch.arange(s, device=h.device))
        rope = rope_cos_sin(s, self.spec.d_head, self.spec.rope_theta, device=h.device) if self.spec.position == "rope" else None
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


def build_model(spec: TransformerSpec, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                seed: int | None = 0) -> Transformer:
    """Build the reference model; on device='meta' no memory is allocated and no init runs."""
    with torch.device(device):
        model = Transformer(spec).to(dtype=dtype)
    if seed is not None and str(device) != "meta":
        model.init_weights(seed)
    return model


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, logits upcast to fp32 as Megatron and Hugging Face do."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))
