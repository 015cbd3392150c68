"""The model description every later step reads: a frozen record of a transformer's shape.

Catalog entries, Hugging Face `config.json` files and the executor's reference model all meet
here. `nn.Module` factories that are not transformers are described by their measured
`ModuleSpec` instead (planner.module_profiler).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from planner.errors import ConfigError

Position = Literal["learned", "rope", "alibi", "relative", "none"]
Norm = Literal["layernorm", "rmsnorm"]


SIZE_LIMITS = {"layers": 100_000, "hidden": 2**20, "heads": 2**16, "kv_heads": 2**16, "head_dim": 2**16,
               "ffn": 2**24, "vocab": 2**24, "seq": 2**24, "max_positions": 2**24}
"""Largest sizes a spec may have: far beyond any trained model (hidden 1M, 16.7M-token vocabulary and
sequence), and small enough that FLOP and byte counts stay exact in float64."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformerSpec:
    """Shape of a decoder-only (or encoder-only / encoder-decoder) transformer language model."""

    name: str
    """Catalog name or the path/identifier the spec was read from."""
    model_type: str = "gpt2"
    """Architecture family: gpt2, llama, mistral, qwen2, opt, gpt_neox, bloom, falcon, bert, t5."""
    layers: int
    """Transformer blocks (decoder blocks for encoder-decoder models)."""
    hidden: int
    """Model width h."""
    heads: int
    """Attention (query) heads a."""
    kv_heads: int = 0
    """Key/value heads for grouped-query attention; 0 means equal to `heads` (multi-head)."""
    head_dim: int = 0
    """Per-head width; 0 means hidden // heads."""
    ffn: int = 0
    """MLP inner width; 0 means 4 * hidden."""
    vocab: int
    """Vocabulary size V (as stored in the embedding table)."""
    seq: int = 2048
    """Default training sequence length s."""
    max_positions: int = 0
    """Rows of a learned position table (only for position='learned'); 0 means seq."""
    position: Position = "learned"
    """How positions enter: learned table, rotary, ALiBi, relative bias (T5) or none."""
    gated_mlp: bool = False
    """SwiGLU/GeGLU style MLP with three matrices (gate, up, down) instead of two."""
    activation: str = "gelu"
    """MLP nonlinearity: gelu, silu, relu."""
    norm: Norm = "layernorm"
    """Normalization: layernorm (weight and bias) or rmsnorm (weight only)."""
    qkv_bias: bool = True
    """Bias on the query/key/value projections."""
    out_bias: bool = True
    """Bias on the attention output projection."""
    mlp_bias: bool = True
    """Biases on the MLP matrices."""
    tied_embeddings: bool = True
    """Output head shares the input embedding matrix."""
    parallel_block: bool = False
    """Attention and MLP read the same input (GPT-J/NeoX/Falcon 'parallel residual')."""
    norms_per_block: int = 2
    """Normalization layers per block (1 for Falcon-7B's shared input norm)."""
    embed_norm: bool = False
    """A normalization right after the embedding (BLOOM's word_embeddings_layernorm, BERT)."""
    type_vocab: int = 0
    """Token-type embedding rows (BERT: 2)."""
    encoder_layers: int = 0
    """Encoder blocks of an encoder-decoder model (T5); 0 for decoder-only / encoder-only."""
    causal: bool = True
    """Causal (decoder) attention; False for BERT-style encoders."""
    final_norm: bool = True
    """A normalization after the last block (False for post-LN BERT)."""
    pooler: bool = False
    """BERT pooler: a dense h x h layer (with bias) on the first token."""
    mlm_head: bool = False
    """BERT masked-LM head: dense h x h + norm before the (tied) decoder, plus a vocabulary bias."""
    relative_buckets: int = 32
    """Buckets of T5's relative position bias (one table of buckets x heads per stack); used only
    when position='relative'."""
    rope_theta: float = 10000.0
    """Rotary base (Llama 3: 500000); used only when position='rope'."""
    sliding_window: int = 0
    """Mistral-style attention window in tokens; 0 means full (causal) attention. Informative only:
    the FLOP model counts the full square, as SDPA kernels and FlopCounterMode do."""
    extras: tuple[tuple[str, object], ...] = field(default=())
    """Source-specific facts kept for reports (e.g. ('source', 'Brown et al. 2020, Table 2.1'))."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(name, value, "a positive integer")
        for name, top in SIZE_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, int) and value > top:
                raise ConfigError(name, value, f"a positive integer up to {top:,} (larger sizes are not a model this "
                                               "planner can compute with)")
        if self.kv_heads < 0 or (self.kv_heads and self.heads % self.kv_heads):
            raise ConfigError("kv_heads", self.kv_heads, f"a divisor of heads({self.heads})")
        if not self.head_dim and self.hidden % self.heads:
            raise ConfigError("heads", self.heads, f"a divisor of hidden({self.hidden}) unless head_dim is given")

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def d_ffn(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def n_positions(self) -> int:
        return (self.max_positions or self.seq) if self.position == "learned" else 0

    @property
    def total_blocks(self) -> int:
        """Blocks in the pipeline-splittable stack (encoder + decoder)."""
        return self.layers + self.encoder_layers

    @property
    def attn_width(self) -> int:
        """Width of the query/output projection, heads x d_head (differs from hidden for GPT-3 13B)."""
        return self.heads * self.d_head

    @property
    def kv_width(self) -> int:
        """Width of each key/value projection, kv_heads x d_head."""
        return self.n_kv_heads * self.d_head

    def with_(self, **changes) -> "TransformerSpec":
        return replace(self, **changes)
