"""The model description every later step reads: a frozen record of a transformer's shape.

Catalog entries, Hugging Face `config.json` files and the executor's reference model all meet
here. `nn.Module` factories that are not transformers are described by their measured
`ModuleSpec` instead (planner.module_profiler).

Mixture-of-experts models carry a nested `MoESpec`, DeepSeek's multi-head latent attention an
`MLASpec`, plus MTP modules, per-block sliding windows, attention sinks and QK-norm; dense models
leave them unset (docs/models.md). `TransformerSpec.block_kinds` lists the different blocks of a model
(an MoE model's leading dense blocks, windowed and full-attention blocks), each with a uniform spec.
"""

from __future__ import annotations

import math

from dataclasses import MISSING, dataclass, field, fields, replace
from functools import lru_cache
from typing import Literal, Mapping

from planner.errors import ConfigError

Position = Literal["learned", "rope", "alibi", "relative", "none"]
Norm = Literal["layernorm", "rmsnorm"]


def yarn_attention_factor(
    factor: float, mscale: float | None = None, mscale_all_dim: float | None = None
) -> float:
    """YaRN's attention factor for a context-extension `factor` (Peng et al. 2023, "YaRN", Sec. 3.4:
    sqrt(1/t) = 0.1 ln(s) + 1): with DeepSeek's mscale and mscale_all_dim both set, the ratio of the
    two scaled forms, else 0.1 ln(factor) + 1; 1 for factor <= 1. Hugging Face's
    _compute_yarn_parameters and Megatron-Core's _yarn_get_concentration_factor compute the same."""

    def scaled(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return scaled(mscale) / scaled(mscale_all_dim)
    return scaled(1.0)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


SIZE_LIMITS = {
    "layers": 100_000,
    "hidden": 2**20,
    "heads": 2**16,
    "kv_heads": 2**16,
    "head_dim": 2**16,
    "ffn": 2**24,
    "vocab": 2**24,
    "seq": 2**24,
    "max_positions": 2**24,
    "sliding_window": 2**24,
    "mtp_modules": 64,
    "moe.experts": 2**16,
    "moe.top_k": 2**16,
    "moe.expert_ffn": 2**24,
    "moe.shared_experts": 2**16,
    "moe.shared_expert_ffn": 2**24,
    "moe.first_dense_layers": 100_000,
    "moe.expert_groups": 2**16,
    "moe.groups_per_token": 2**16,
    "mla.q_lora_rank": 2**20,
    "mla.kv_lora_rank": 2**20,
    "mla.qk_rope_head_dim": 2**16,
    "mla.qk_nope_head_dim": 2**16,
    "mla.v_head_dim": 2**16,
}
"""Largest sizes a spec may have: far beyond any trained model (hidden 1M, 16.7M-token vocabulary and
sequence, 65536 experts), and small enough that FLOP and byte counts stay exact in float64. Keys of
the nested records are written `moe.<field>` / `mla.<field>`, as their errors name them."""


def _check_int(where: str, value, *, minimum: int) -> None:
    """One-line ConfigError unless `value` is an int in [minimum, SIZE_LIMITS[where]]."""
    top = SIZE_LIMITS.get(where)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(where, value, allowed)
    if top is not None and value > top:
        raise ConfigError(
            where,
            value,
            f"an integer up to {top:,} (larger sizes are not a model this planner can "
            "compute with)",
        )


def record_of(cls, value, where: str):
    """`value` as a `cls` record: the record itself, or a mapping of its fields (a plan document's
    `model.arch`); an unknown key is a ConfigError naming it."""
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(where, value, f"an object with the fields of {cls.__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}",
            value[unknown[0]],
            "one of the fields " + ", ".join(sorted(known)),
        )
    missing = [f.name for f in fields(cls) if f.name not in value and f.default is MISSING]
    if missing:
        raise ConfigError(
            f"{where}.{missing[0]}",
            None,
            "a value (the field is required)",
            message=f"{where}.{missing[0]} is missing (required for {cls.__name__})",
        )
    return cls(**value)


Router = Literal["softmax", "sigmoid"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MoESpec:
    """A mixture-of-experts MLP (Shazeer et al. 2017; Fedus et al. 2021, Switch; Jiang et al. 2024,
    Mixtral Sec. 2.1; Dai et al. 2024, DeepSeekMoE) in place of the dense MLP of every block from
    `first_dense_layers` on. Each expert is an MLP of the spec's kind (gated or not, `mlp_bias`) of
    width `expert_ffn`; a token goes through its `top_k` routed experts and every shared expert."""

    experts: int
    """Routed experts per MoE layer E (HF num_local_experts / num_experts / n_routed_experts)."""
    top_k: int
    """Routed experts each token goes to k (HF num_experts_per_tok)."""
    expert_ffn: int
    """Inner width of one routed expert's MLP (HF moe_intermediate_size; Mixtral intermediate_size)."""
    shared_experts: int = 0
    """Experts every token goes through (DeepSeekMoE shared experts, Qwen2-MoE's shared expert); 0: none."""
    shared_expert_ffn: int = 0
    """Inner width of one shared expert; 0 means expert_ffn."""
    first_dense_layers: int = 0
    """Leading blocks with the dense MLP of width `TransformerSpec.ffn` instead of experts (HF
    first_k_dense_replace: DeepSeek-V3 3)."""
    router: Router = "softmax"
    """Scoring function of the router: softmax over all experts (Mixtral, Qwen, gpt-oss) or a
    sigmoid per expert (DeepSeek-V3, Sec. 2.1.2)."""
    normalize_top_k: bool = True
    """Gate weights renormalized over the selected experts (= a softmax over the top-k logits for
    softmax routers; HF norm_topk_prob); False keeps the full-softmax probabilities (Qwen2-MoE)."""
    routed_scaling: float = 1.0
    """Factor on the routed experts' gate weights (DeepSeek-V3 routed_scaling_factor 2.5)."""
    router_bias: bool = False
    """A learned bias on the router's logits (gpt-oss)."""
    aux_free_bias: bool = False
    """DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to the scores for the top-k
    choice only, updated by a rule, not by gradients (report Sec. 2.1.2); not a trained parameter."""
    expert_groups: int = 1
    """Groups the experts are split into for group-limited routing (DeepSeek-V3 n_group 8: one per node)."""
    groups_per_token: int = 0
    """Groups a token's experts may come from (DeepSeek-V3 topk_group 4); 0 means all groups."""
    shared_expert_gate: bool = False
    """Qwen2-MoE: the shared expert's output is scaled by sigmoid(x w_g), w_g a h x 1 weight."""
    capacity_factor: float | None = None
    """Token capacity of an expert as a multiple of its even share t k / E (Lepikhin et al. 2020,
    GShard; Fedus et al. 2021, Switch Sec. 2.2); tokens over capacity are dropped and each expert
    computes its padded buffer. None means dropless (every token reaches its k experts)."""

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "expert_ffn", "expert_groups"):
            _check_int(f"moe.{name}", getattr(self, name), minimum=1)
        for name in (
            "shared_experts",
            "shared_expert_ffn",
            "first_dense_layers",
            "groups_per_token",
        ):
            _check_int(f"moe.{name}", getattr(self, name), minimum=0)
        if self.top_k > self.experts:
            raise ConfigError("moe.top_k", self.top_k, f"at most experts({self.experts})")
        if self.router not in ("softmax", "sigmoid"):
            raise ConfigError("moe.router", self.router, "softmax or sigmoid")
        if self.experts % self.expert_groups:
            raise ConfigError(
                "moe.expert_groups", self.expert_groups, f"a divisor of experts({self.experts})"
            )
        if self.groups_per_token > self.expert_groups:
            raise ConfigError(
                "moe.groups_per_token",
                self.groups_per_token,
                f"at most expert_groups({self.expert_groups}); 0 for all",
            )
        if self.groups_per_token and self.top_k > self.groups_per_token * (
            self.experts // self.expert_groups
        ):
            raise ConfigError(
                "moe.top_k",
                self.top_k,
                f"at most the {self.groups_per_token} x "
                f"{self.experts // self.expert_groups} experts of the groups a token may use",
            )
        for name in ("routed_scaling", "capacity_factor"):
            value = getattr(self, name)
            if value is None and name == "capacity_factor":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 < value < 1e6
            ):
                raise ConfigError(
                    f"moe.{name}",
                    value,
                    "a positive number"
                    + (" or null (dropless)" if name == "capacity_factor" else ""),
                )
        for name in ("normalize_top_k", "router_bias", "aux_free_bias", "shared_expert_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"moe.{name}", getattr(self, name), "true or false")

    @property
    def d_shared_ffn(self) -> int:
        """Inner width of one shared expert."""
        return self.shared_expert_ffn or self.expert_ffn

    @property
    def active_ffn(self) -> int:
        """MLP inner width one token goes through: k f_e + shared x f_s."""
        return self.top_k * self.expert_ffn + self.shared_experts * self.d_shared_ffn


@dataclass(frozen=True, kw_only=True, slots=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2 Sec. 2.1; DeepSeek-V3 report Sec.
    2.1.1): queries and keys/values go through low-rank latents, and each head's query/key is a
    `qk_nope_head_dim` part from the latent plus a `qk_rope_head_dim` rotary part (the key's rotary part
    is one head shared by all). Projections (HF DeepseekV3Attention names):
        q_a (h x q_lora) -> RMSNorm -> q_b (q_lora x a (nope + rope))      [q (h x a (nope + rope)) if q_lora = 0]
        kv_a (h x (kv_lora + rope)) -> RMSNorm on the kv_lora part -> kv_b (kv_lora x a (nope + v))
        o (a v x h)."""

    q_lora_rank: int = 0
    """Query latent width; 0 means queries are projected directly (DeepSeek-V2-Lite)."""
    kv_lora_rank: int
    """Key/value latent width (the cached vector)."""
    qk_rope_head_dim: int
    """Rotary part of each query/key head."""
    qk_nope_head_dim: int
    """Non-rotary part of each query/key head."""
    v_head_dim: int
    """Value (and attention output) width per head."""

    def __post_init__(self) -> None:
        _check_int("mla.q_lora_rank", self.q_lora_rank, minimum=0)
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            _check_int(f"mla.{name}", getattr(self, name), minimum=1)

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: nope + rope (DeepSeek-V3: 128 + 64 = 192)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformerSpec:
    """Shape of a decoder-only (or encoder-only / encoder-decoder) transformer language model."""

    name: str
    """Catalog name or the path/identifier the spec was read from."""
    model_type: str = "gpt2"
    """Architecture family: gpt2, llama, mistral, qwen2, opt, gpt_neox, bloom, falcon, bert, t5, and the
    MoE families mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss."""
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
    """MLP inner width; 0 means 4 * hidden. For an MoE model the width of its leading dense blocks
    (moe.first_dense_layers); the experts' width is moe.expert_ffn."""
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
    """Attention window in tokens (Mistral, gpt-oss's banded layers); 0 means full (causal) attention.
    A windowed layer's attention core counts min(window, s) keys per query (cost_models.flops)."""
    window_layers: tuple[int, ...] | None = None
    """0-based blocks that use `sliding_window`; None means every block (Mistral). gpt-oss: the even
    blocks 0, 2, ... (HF layer_types 'sliding_attention'), the others attend to the full context."""
    attention_sinks: bool = False
    """gpt-oss: one learned logit per head and block added to the softmax denominator (heads params)."""
    rope_attention_factor: float = 1.0
    """YaRN's attention factor, which scales the rotary cos and sin tables (Peng et al. 2023,
    "YaRN", Sec. 3.4: 0.1 ln(factor) + 1, or the mscale / mscale_all_dim ratio;
    yarn_attention_factor); 1 for plain RoPE. gpt-oss: 0.1 ln 32 + 1 = 1.3466. Megatron-Core
    runs RoPE unfused when it is not 1 (cost_models.blocks.unfused_rope_traffic)."""
    activation_clamp: float = 0.0
    """gpt-oss's clamped gated activation (HF swiglu_limit, 7.0): the gate half is clamped above
    and the linear half to +-limit before the product; 0 for none
    (cost_models.blocks.moe_expert_traffic)."""
    qk_norm: bool = False
    """Qwen3: an RMSNorm of width d_head on every query and key head (2 d_head params per block)."""
    moe: MoESpec | None = None
    """Mixture-of-experts MLP (MoESpec); None for a dense model."""
    mla: MLASpec | None = None
    """Multi-head latent attention (MLASpec, DeepSeek-V3) in place of Q/K/V/O; None for standard
    (grouped-query) attention. With MLA, d_head is the query/key head width (nope + rope)."""
    mtp_modules: int = 0
    """Multi-token prediction modules (DeepSeek-V3 report Sec. 2.2; HF num_nextn_predict_layers): each
    is a block of the model's last kind plus two norms, a 2h x h projection and a final norm, sharing
    the embedding and output head. Trained with the model; counted apart from its parameters
    (cost_models.params.mtp_params), as DeepSeek's 671B excludes them."""
    extras: tuple[tuple[str, object], ...] = field(default=())
    """Source-specific facts kept for reports (e.g. ('source', 'Brown et al. 2020, Table 2.1'))."""

    def __post_init__(self) -> None:
        # nested records and tuples arrive as mappings and lists from JSON (plan documents, run specs)
        object.__setattr__(self, "moe", record_of(MoESpec, self.moe, "moe"))
        object.__setattr__(self, "mla", record_of(MLASpec, self.mla, "mla"))
        if isinstance(self.window_layers, list):
            object.__setattr__(self, "window_layers", tuple(self.window_layers))
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(name, value, "a positive integer")
        for name, top in SIZE_LIMITS.items():
            if "." in name:  # fields of the nested records, checked by them
                continue
            value = getattr(self, name)
            if isinstance(value, int) and value > top:
                raise ConfigError(
                    name,
                    value,
                    f"a positive integer up to {top:,} (larger sizes are not a model this "
                    "planner can compute with)",
                )
        if self.kv_heads < 0 or (self.kv_heads and self.heads % self.kv_heads):
            raise ConfigError("kv_heads", self.kv_heads, f"a divisor of heads({self.heads})")
        if not self.head_dim and self.hidden % self.heads and self.mla is None:
            raise ConfigError(
                "heads", self.heads, f"a divisor of hidden({self.hidden}) unless head_dim is given"
            )
        if self.position == "rope" and self.mla is None and self.d_head % 2:
            # rotary embeddings turn pairs of dimensions (Su et al. 2021, RoFormer, Sec. 3.2.2)
            allowed = "an even number with rotary position embeddings (they rotate pairs)"
            raise ConfigError("head_dim", self.d_head, allowed)
        self._check_moe_fields()

    def _check_moe_fields(self) -> None:
        """The fields added for MoE / MLA / gpt-oss models (module SIZE_LIMITS, one-line errors)."""
        _check_int("sliding_window", self.sliding_window, minimum=0)
        _check_int("mtp_modules", self.mtp_modules, minimum=0)
        if self.window_layers is not None:
            if not isinstance(self.window_layers, tuple) or not self.sliding_window:
                raise ConfigError(
                    "window_layers",
                    self.window_layers,
                    "a list of block indices, given together with sliding_window > 0",
                )
            for i in self.window_layers:
                if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.layers:
                    raise ConfigError("window_layers", i, f"block indices 0..{self.layers - 1}")
            if len(set(self.window_layers)) != len(self.window_layers):
                raise ConfigError("window_layers", self.window_layers, "distinct block indices")
        if self.moe is not None and self.moe.first_dense_layers >= self.layers:
            raise ConfigError(
                "moe.first_dense_layers",
                self.moe.first_dense_layers,
                f"fewer than layers({self.layers}) (a model with no MoE layer has moe null)",
            )
        if self.moe is not None and self.encoder_layers:
            raise ConfigError(
                "moe",
                "set",
                "null for encoder-decoder models (MoE is modelled for decoder-only ones)",
            )
        if self.mla is not None:
            if self.head_dim not in (0, self.mla.qk_head_dim):
                raise ConfigError(
                    "head_dim", self.head_dim, f"0 or mla's qk head width ({self.mla.qk_head_dim})"
                )
            if self.kv_heads not in (0, self.heads):
                raise ConfigError(
                    "kv_heads",
                    self.kv_heads,
                    "0 or heads with MLA (each head has its own key/value)",
                )
            if self.encoder_layers:
                raise ConfigError("mla", "set", "null for encoder-decoder models")
        for name in ("attention_sinks", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "true or false")
        if not _number(self.rope_attention_factor) or self.rope_attention_factor <= 0:
            raise ConfigError("rope_attention_factor", self.rope_attention_factor, "a number > 0")
        if not _number(self.activation_clamp) or self.activation_clamp < 0:
            raise ConfigError("activation_clamp", self.activation_clamp, "a number >= 0 (0: none)")

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        """Query/key width per head (MLA: nope + rope)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_dim or self.hidden // self.heads

    @property
    def d_value(self) -> int:
        """Value (attention output) width per head: d_head, or MLA's v_head_dim."""
        return self.mla.v_head_dim if self.mla is not None else self.d_head

    @property
    def d_ffn(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def swiglu(self) -> bool:
        """The MLP is SwiGLU: gated, with SiLU (Llama, Mixtral, Qwen, DeepSeek)."""
        return self.gated_mlp and self.activation == "silu"

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

    def windowed(self, layer: int) -> bool:
        """Whether block `layer` (0-based) attends through the sliding window."""
        if not self.sliding_window:
            return False
        return self.window_layers is None or layer in self.window_layers

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block `layer` (0-based) has experts (False for the leading dense blocks)."""
        return self.moe is not None and layer >= self.moe.first_dense_layers

    @property
    def is_uniform(self) -> bool:
        """All blocks alike: no leading dense blocks before the experts, and the window (if any) on
        every block or none."""
        mixed_mlp = self.moe is not None and self.moe.first_dense_layers > 0
        mixed_window = (
            bool(self.sliding_window)
            and self.window_layers is not None
            and len(set(self.window_layers)) not in (0, self.layers)
        )
        return not (mixed_mlp or mixed_window)

    @property
    def block_kinds(self) -> "tuple[BlockKind, ...]":
        """The distinct blocks of the model, in order of first appearance: (dense | moe) x (full |
        windowed attention). A model whose blocks are all alike has one kind whose spec is itself.
        Computed once per distinct spec (the cost model asks for it per pipeline rank and per scoring call;
        a spec is frozen, so its kinds never change)."""
        try:
            return _block_kinds_cached(self)
        except TypeError:  # an unhashable value in `extras`
            return self._block_kinds()

    def _block_kinds(self) -> "tuple[BlockKind, ...]":
        if self.is_uniform:
            return (
                BlockKind(
                    name=_kind_name(self.moe is not None, self.windowed(0)),
                    layers=tuple(range(self.layers)),
                    spec=self,
                ),
            )
        groups: dict[tuple[bool, bool], list[int]] = {}
        for i in range(self.layers):
            groups.setdefault((self.is_moe_layer(i), self.windowed(i)), []).append(i)
        if len(groups) == 1:
            (((moe, windowed), layers),) = groups.items()
            return (BlockKind(name=_kind_name(moe, windowed), layers=tuple(layers), spec=self),)
        return tuple(
            BlockKind(
                name=_kind_name(moe, windowed),
                layers=tuple(layers),
                spec=self.block_view(moe=moe, windowed=windowed, layers=len(layers)),
            )
            for (moe, windowed), layers in groups.items()
        )

    def block_view(self, *, moe: bool, windowed: bool, layers: int) -> "TransformerSpec":
        """A model of `layers` identical blocks of one kind of this model (block_kinds)."""
        return replace(
            self,
            layers=layers,
            mtp_modules=0,
            window_layers=None,
            sliding_window=self.sliding_window if windowed else 0,
            moe=replace(self.moe, first_dense_layers=0) if moe else None,
        )

    @property
    def block_mix(self) -> "tuple[tuple[float, TransformerSpec], ...]":
        """The repeating block as (share of blocks, uniform spec) pairs: every kind except the leading
        dense blocks of an MoE model (they sit on the first pipeline stage; cost_models.params.
        rank_params places them there). What `block_*` cost functions of a mixed model average over."""
        if self.is_uniform:
            return ((1.0, self),)
        kinds = self.block_kinds
        repeating = [k for k in kinds if self.moe is None or k.spec.moe is not None]
        n = sum(len(k.layers) for k in repeating)
        return tuple((len(k.layers) / n, k.spec) for k in repeating)

    @property
    def last_kind(self) -> "TransformerSpec":
        """The uniform spec of the last block (what an MTP module's block is)."""
        kinds = self.block_kinds
        return next(k.spec for k in kinds if self.layers - 1 in k.layers)

    def with_(self, **changes) -> "TransformerSpec":
        return replace(self, **changes)


@lru_cache(maxsize=64)
def _block_kinds_cached(spec: TransformerSpec) -> "tuple[BlockKind, ...]":
    return spec._block_kinds()


def _kind_name(moe: bool, windowed: bool) -> str:
    return ("moe" if moe else "dense") + ("-window" if windowed else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockKind:
    """One kind of block of a model and the blocks that have it (TransformerSpec.block_kinds)."""

    name: str
    """dense, moe, dense-window or moe-window."""
    layers: tuple[int, ...]
    """0-based indices of the blocks of this kind."""
    spec: TransformerSpec
    """A model of len(layers) blocks of only this kind (the whole model itself when uniform)."""


def with_seq(spec: TransformerSpec, seq: int | None) -> TransformerSpec:
    """`spec` at sequence length `seq` (None keeps it); learned positions bound it."""
    if seq is None or seq == spec.seq:
        return spec
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ConfigError("seq", seq, "a positive integer")
    if spec.position == "learned" and spec.max_positions and seq > spec.max_positions:
        raise ConfigError(
            "seq",
            seq,
            f"at most {spec.max_positions} (rows of {spec.name}'s learned position table)",
        )
    if spec.position == "learned" and not spec.max_positions:
        spec = spec.with_(max_positions=spec.seq)
        if seq > spec.max_positions:
            raise ConfigError(
                "seq",
                seq,
                f"at most {spec.max_positions} (rows of {spec.name}'s learned position table)",
            )
    return spec.with_(seq=seq)
