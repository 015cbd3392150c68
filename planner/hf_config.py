"""Read a Hugging Face `config.json` into a `TransformerSpec`, without `transformers`.

The default sequence length (no --seq) is the config's position count, capped at 8192 for RoPE
models whose max_position_embeddings names a long extended context (Llama 3.1, Qwen2: 131072).

Supported `model_type`s and the keys read (defaults are those of the matching transformers
configuration class, so a config that omits a key means what transformers would make of it):
- llama, mistral, qwen2: hidden_size, num_hidden_layers, num_attention_heads,
  num_key_value_heads (= heads), head_dim (= hidden/heads), intermediate_size, vocab_size,
  max_position_embeddings, tie_word_embeddings (False), attention_bias (False; qwen2: Q/K/V biases
  always, no O bias), mlp_bias (False), hidden_act (silu), rope_theta or rope_parameters.rope_theta,
  sliding_window (mistral). RMSNorm, gated MLP (SwiGLU), rotary positions.
- gpt2: n_embd, n_layer, n_head, n_inner (= 4 n_embd), vocab_size, n_positions,
  activation_function, tie_word_embeddings (True). LayerNorm, biases, learned positions.
- opt: hidden_size, num_hidden_layers, num_attention_heads, ffn_dim, vocab_size,
  max_position_embeddings (+2 rows: OPT's learned positions are offset by 2), enable_bias (True),
  do_layer_norm_before (True; False drops the final LayerNorm), word_embed_proj_dim (must equal
  hidden_size), tie_word_embeddings (True). ReLU MLP.
- gpt_neox: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
  max_position_embeddings, use_parallel_residual (True), attention_bias (True), hidden_act,
  tie_word_embeddings (False). Rotary positions, LayerNorm, biases.
- bloom: hidden_size (or n_embed), n_layer, n_head (or num_attention_heads), vocab_size,
  seq_length (2048, BLOOM's training length; BLOOM has no position table), tie_word_embeddings
  (True). ALiBi, embedding LayerNorm, 4h GELU MLP, biases.
- falcon: hidden_size, num_hidden_layers, num_attention_heads, num_kv_heads, multi_query,
  new_decoder_architecture, parallel_attn, num_ln_in_parallel_attn, bias (False), alibi,
  ffn_hidden_size (= 4h), vocab_size, max_position_embeddings (2048), tie_word_embeddings (True).
- qwen3: the llama keys with head_dim (128), attention_bias (False) on Q/K/V/O, QK-norm (RMSNorm per head
  on queries and keys), rope_theta (Qwen3-8B: 1e6), use_sliding_window must be false.
- phi3: the llama keys (num_key_value_heads = heads; vocab 32064; max_position_embeddings 4096), no biases,
  sliding_window (null; Phi-3-mini 4k: 2047) on every block when set.
- gemma: the llama keys with head_dim (256), hidden_activation (gelu_pytorch_tanh: a GeGLU MLP; else
  hidden_act), tie_word_embeddings (True), attention_bias (False); vocab 256000.

- mixtral: the llama keys (attention_bias and mlp_bias do not exist: no biases; head_dim = hidden /
  heads; max_position_embeddings 131072; rope_theta 1e6 via rope_parameters, else 10000) plus
  num_local_experts (8), num_experts_per_tok (2); every block is MoE, each expert an
  intermediate_size-wide SwiGLU MLP; sliding_window (null) on every block when set.
- qwen2_moe: the qwen2 keys (qkv_bias (True) on Q/K/V, no O bias) plus num_experts (60),
  num_experts_per_tok (4), moe_intermediate_size (1408), shared_expert_intermediate_size (5632: one
  shared expert, gated by a sigmoid of an h x 1 projection), norm_topk_prob (False),
  decoder_sparse_step (1) and mlp_only_layers ([]); use_sliding_window (False) with sliding_window
  (4096) on the blocks layer_types names 'sliding_attention' (default: even blocks below
  max_window_layers (28)).
- qwen3_moe: hidden_size, num_hidden_layers, num_attention_heads (32), num_key_value_heads (4),
  head_dim (= hidden / heads: the configuration class has no head_dim; the released configs give
  128), attention_bias (False), QK-norm, num_experts (128), num_experts_per_tok (8),
  moe_intermediate_size (768), norm_topk_prob (False), decoder_sparse_step (1), mlp_only_layers
  ([]); use_sliding_window must be false.
- deepseek_v3: hidden_size (7168), num_hidden_layers (61), num_attention_heads (128),
  intermediate_size (18432, the leading dense blocks' MLP), moe_intermediate_size (2048),
  n_routed_experts (256), n_shared_experts (1), num_experts_per_tok (8), first_k_dense_replace (3),
  moe_layer_freq (1; other values not supported), n_group (8), topk_group (4), norm_topk_prob (True),
  routed_scaling_factor (2.5), scoring_func (sigmoid), topk_method (noaux_tc: the aux-loss-free bias),
  MLA: q_lora_rank (1536; null = no query latent), kv_lora_rank (512), qk_rope_head_dim (64),
  qk_nope_head_dim (128), v_head_dim (128); attention_bias (False), num_nextn_predict_layers (0: the
  transformers class builds no MTP module; DeepSeek's config gives 1), max_position_embeddings
  (4096), vocab_size (129280).
- gpt_oss: hidden_size (2880), num_hidden_layers (36), num_attention_heads (64), num_key_value_heads
  (8), head_dim (64), intermediate_size (2880, each expert's width), num_local_experts (128),
  num_experts_per_tok (4; OpenAI's experts_per_token is read when it is absent), sliding_window
  (128) on the blocks layer_types names 'sliding_attention' (default: the even blocks),
  attention_bias (True), attention sinks, router and expert biases, rope_theta 150000,
  max_position_embeddings (131072), vocab_size (201088), swiglu_limit (7.0).
Every RoPE reader of the MoE families takes rope_parameters / rope_scaling of rope_type "yarn" as
its attention factor (attention_factor, else from factor, mscale and mscale_all_dim; 1 otherwise).
MoE models are dropless (capacity_factor null): no publisher states a training capacity factor.

Every problem (not JSON, not an object, unknown model_type, a missing or non-positive size) is a
`ConfigError` naming the key.
"""

from __future__ import annotations

import math
from pathlib import Path

from planner.errors import ConfigError
from planner.spec import MLASpec, MoESpec, TransformerSpec, yarn_attention_factor

from planner.io import read_json

MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "gpt2",
    "opt",
    "gpt_neox",
    "bloom",
    "falcon",
    "qwen3",
    "phi3",
    "gemma",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
)


class _Keys:
    """Typed access to the config's keys; errors name the key and the file."""

    def __init__(self, data: dict, path: str, model_type: str):
        self.data, self.path, self.model_type = data, path, model_type

    def _missing(self, key: str) -> ConfigError:
        return ConfigError(
            key,
            None,
            "a positive integer",
            message=f"{self.path}: {key} is missing (required for model_type {self.model_type!r})",
        )

    def int(self, *keys: str, default: int | None = None) -> int:
        """The first present key among `keys`, a positive integer; `default` if none is present."""
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(
                    key,
                    value,
                    "a positive integer",
                    message=f"{self.path}: {key}={value!r} is invalid: allowed a positive integer",
                )
            return value
        if default is None:
            raise self._missing(keys[0])
        return default

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(
                key,
                value,
                "true or false",
                message=f"{self.path}: {key}={value!r} is invalid: allowed true or false",
            )
        return value

    def str(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(
                key,
                value,
                "a string",
                message=f"{self.path}: {key}={value!r} is invalid: allowed a string",
            )
        return value

    def optional_int(self, key: str, default: int | None) -> int | None:
        """A positive integer, or None where the config says null (q_lora_rank: no query latent)."""
        if key in self.data and self.data[key] is None:
            return None
        return self.int(key, default=default) if key in self.data or default is not None else None

    def int_list(self, key: str) -> list[int]:
        """A list of non-negative integers (mlp_only_layers); [] when absent or null."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value
        ):
            raise ConfigError(
                key,
                value,
                "a list of block indices",
                message=f"{self.path}: {key}={value!r} is invalid: allowed a list of block indices",
            )
        return value

    def window_layers(self, layers: int, default: list[bool]) -> tuple[int, ...]:
        """Blocks whose layer_types entry is 'sliding_attention' (`default` flags when absent)."""
        value = self.data.get("layer_types")
        if value is None:
            return tuple(i for i, windowed in enumerate(default) if windowed)
        allowed = ("sliding_attention", "full_attention")
        if (
            not isinstance(value, list)
            or len(value) != layers
            or any(v not in allowed for v in value)
        ):
            raise ConfigError(
                "layer_types",
                value,
                f"a list of {layers} entries, each one of {', '.join(allowed)}",
                message=f"{self.path}: layer_types is invalid: allowed a list of num_hidden_layers "
                f"({layers}) entries, each 'sliding_attention' or 'full_attention'",
            )
        return tuple(i for i, v in enumerate(value) if v == "sliding_attention")

    def unsupported(self, key: str, value, allowed: str) -> ConfigError:
        return ConfigError(
            key,
            value,
            allowed,
            message=f"{self.path}: {key}={value!r} is not supported: allowed {allowed}",
        )

    def float(self, key: str, default: float) -> float:
        value = self.data.get(key, default)
        if value is None:
            return default
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ConfigError(
                key,
                value,
                "a positive number",
                message=f"{self.path}: {key}={value!r} is invalid: allowed a positive number",
            )
        return float(value)


def load_json(path: str | Path) -> dict:
    """The JSON object in `path` (planner.io.read_json): ConfigError for a missing, empty, malformed,
    non-strict, too deeply nested or non-object file."""
    return read_json(path, "config.json")


def read_hf_config(path: str | Path, *, seq: int | None = None) -> TransformerSpec:
    """Parse `path` (a HF config.json) into a TransformerSpec named after the file."""
    data = load_json(path)
    return spec_from_dict(data, name=str(path), seq=seq)


DROPOUT_KEYS = (
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout",
    "attention_dropout",
    "dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "activation_dropout",
)
"""The dropout probabilities Hugging Face configs name (GPT-2: resid/embd/attn_pdrop 0.1; OPT: dropout 0.1;
Llama and Mistral: attention_dropout 0.0; BERT-style: *_dropout_prob)."""
ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")
"""The DROPOUT_KEYS that drop attention probabilities (inside a fused attention kernel); OPT's 0.1
`dropout` is its residual one, beside an attention_dropout of 0.0."""
ATTENTION_IMPLEMENTATIONS = {
    "sdpa": "sdpa",
    "flash_attention_2": "flash",
    "flash_attention_3": "fused",
    "eager": "unfused",
}
"""transformers' attn_implementation names -> the planner's attention kernels (frameworks.ATTENTION_KERNELS)."""


def training_defaults(data: dict) -> tuple[tuple[str, object], ...]:
    """What a config says about how its modules train, as TransformerSpec extras: `dropout` (the
    largest probability among DROPOUT_KEYS, with the key that set it), `attention_dropout` (the
    largest among ATTENTION_DROPOUT_KEYS, where the config names one) and `attention` (from
    `_attn_implementation` / `attn_implementation` when the config records one). `torch_dtype` is
    the checkpoint's storage dtype, not the training precision, and is not used."""
    out: list[tuple[str, object]] = []
    probs = {
        k: float(data[k])
        for k in DROPOUT_KEYS
        if isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool)
    }
    if probs:
        key = max(probs, key=probs.get)
        out += [("dropout", probs[key]), ("dropout_key", key)]
    attention = [probs[k] for k in ATTENTION_DROPOUT_KEYS if k in probs]
    if attention:
        out.append(("attention_dropout", max(attention)))
    impl = data.get("_attn_implementation") or data.get("attn_implementation")
    if impl in ATTENTION_IMPLEMENTATIONS:
        out.append(("attention", ATTENTION_IMPLEMENTATIONS[impl]))
    return tuple(out)


DEFAULT_SEQ_CAP = 8192
"""Default training length of RoPE models whose max_position_embeddings is longer (pass --seq)."""


def spec_from_dict(data: dict, *, name: str, seq: int | None = None) -> TransformerSpec:
    """Map a config dict onto a TransformerSpec (see the module docstring for keys and defaults)."""
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            "model_type",
            model_type,
            "one of " + ", ".join(MODEL_TYPES),
            message=f"{name}: model_type={model_type!r} is not supported: allowed "
            + ", ".join(MODEL_TYPES),
        )
    k = _Keys(data, name, model_type)
    fields = _READERS[model_type](k)
    default_seq = fields.pop("seq")
    max_positions = fields.get("max_positions", 0)
    if (
        seq is not None
        and fields.get("position") == "learned"
        and max_positions
        and seq > max_positions
    ):
        raise ConfigError(
            "seq", seq, f"at most {max_positions} (rows of the learned position table of {name})"
        )
    extras = (("source", name), ("model_type", model_type)) + training_defaults(data)
    if seq is None and fields.get("position") != "learned" and default_seq > DEFAULT_SEQ_CAP:
        # a RoPE model's max_position_embeddings is the context it was extended to, not the length it
        # is trained at (Llama 3.1: 131072, pre-trained at 8192, Dubey et al. 2024 Sec. 3.4; Qwen2:
        # 32768-131072): planning for it by default would put a 16x longer sequence in every estimate
        extras += (("seq_default_capped_from", default_seq),)
        default_seq = DEFAULT_SEQ_CAP
    return TransformerSpec(
        name=name, model_type=model_type, seq=seq or default_seq, extras=extras, **fields
    )


def _check_heads(k: _Keys, hidden: int, heads: int, head_dim: int) -> None:
    if not head_dim and hidden % heads:
        raise ConfigError(
            "num_attention_heads",
            heads,
            f"a divisor of hidden_size({hidden})",
            message=f"{k.path}: num_attention_heads={heads} does not divide hidden_size={hidden}",
        )


def _llama_like(k: _Keys) -> dict:
    shape = _gqa(k)
    theta = _rope_theta(k, 10000.0)
    qwen = k.model_type == "qwen2"
    attention_bias = k.bool("attention_bias", False)
    window = k.data.get("sliding_window") if k.model_type == "mistral" else None
    return dict(
        layers=k.int("num_hidden_layers"),
        **shape,
        ffn=k.int("intermediate_size"),
        vocab=k.int("vocab_size"),
        seq=k.int("max_position_embeddings", default=2048),
        position="rope",
        rope_theta=theta,
        gated_mlp=True,
        activation=k.str("hidden_act", "silu"),
        norm="rmsnorm",
        qkv_bias=True if qwen else attention_bias,
        out_bias=False if qwen else attention_bias,
        mlp_bias=k.bool("mlp_bias", False),
        tied_embeddings=k.bool("tie_word_embeddings", False),
        sliding_window=window if isinstance(window, int) and window > 0 else 0,
    )


def _qwen3(k: _Keys) -> dict:
    """Qwen3 dense (transformers Qwen3Config): Qwen2's shape with QK-norm, an explicit head_dim (128) and no
    biases; sliding windows are refused as for qwen3_moe (no released config uses them)."""
    if k.bool("use_sliding_window", False):
        raise k.unsupported("use_sliding_window", True, "false for qwen3")
    fields = _gqa(
        k, hidden_default=4096, heads_default=32, kv_default=32, head_dim_default=128
    ) | _rope_model(k, theta=10000.0, positions=32768, vocab=151936)
    bias = k.bool("attention_bias", False)
    return fields | dict(
        layers=k.int("num_hidden_layers", default=32),
        ffn=k.int("intermediate_size", default=22016),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=False,
        qk_norm=True,
    )


def _phi3(k: _Keys) -> dict:
    """Phi-3 / Phi-4 (transformers Phi3Config): Llama's shape with fused qkv_proj and gate_up_proj (the same
    weights and FLOPs), no biases, untied; sliding_window (Phi-3-mini 4k: 2047) on every block when set. A
    partial_rotary_factor below 1 rotates fewer dimensions, which changes no cost this model counts."""
    window = k.int("sliding_window", default=0) if k.data.get("sliding_window") is not None else 0
    fields = _gqa(k, hidden_default=3072, heads_default=32) | _rope_model(
        k, theta=10000.0, positions=4096, vocab=32064
    )
    return fields | dict(
        layers=k.int("num_hidden_layers", default=32),
        ffn=k.int("intermediate_size", default=8192),
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
        sliding_window=window,
    )


GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")
"""The gated MLP activations Gemma's configs name (hidden_activation, else hidden_act): GeGLU, tanh-approximated."""


def _gemma(k: _Keys) -> dict:
    """Gemma 1 (transformers GemmaConfig): head_dim 256 (defaults of Gemma-7B), GeGLU MLP, RMSNorm, tied
    embeddings scaled by sqrt(hidden) (an elementwise multiply the cost model does not count). Gemma 2 and 3
    (soft-capping, local/global blocks, four norms per block) are other model_types, not read here."""
    activation = k.str("hidden_activation", "") or k.str("hidden_act", "gelu_pytorch_tanh")
    if activation not in GEMMA_ACTIVATIONS:
        raise k.unsupported("hidden_activation", activation, " or ".join(GEMMA_ACTIVATIONS))
    fields = _gqa(
        k, hidden_default=3072, heads_default=16, kv_default=16, head_dim_default=256
    ) | _rope_model(k, theta=10000.0, positions=8192, vocab=256000)
    bias = k.bool("attention_bias", False)
    return fields | dict(
        layers=k.int("num_hidden_layers", default=28),
        ffn=k.int("intermediate_size", default=24576),
        activation=activation,
        tied_embeddings=k.bool("tie_word_embeddings", True),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=False,
    )


def _gpt2(k: _Keys) -> dict:
    hidden = k.int("n_embd", "hidden_size")
    heads = k.int("n_head", "num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    positions = k.int("n_positions", "max_position_embeddings")
    return dict(
        layers=k.int("n_layer", "num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        ffn=k.int("n_inner", default=4 * hidden),
        vocab=k.int("vocab_size"),
        seq=positions,
        max_positions=positions,
        position="learned",
        activation=k.str("activation_function", "gelu_new"),
        norm="layernorm",
        tied_embeddings=k.bool("tie_word_embeddings", True),
    )


def _opt(k: _Keys) -> dict:
    hidden = k.int("hidden_size")
    heads = k.int("num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    proj = k.int("word_embed_proj_dim", default=hidden)
    if proj != hidden:
        raise ConfigError(
            "word_embed_proj_dim",
            proj,
            f"equal to hidden_size({hidden}); OPT's project_in/out layers are not modelled",
            message=f"{k.path}: word_embed_proj_dim={proj} != hidden_size={hidden} is not supported "
            "(OPT-350m's embedding projections are not modelled)",
        )
    positions = k.int("max_position_embeddings", default=2048)
    bias = k.bool("enable_bias", True)
    return dict(
        layers=k.int("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        ffn=k.int("ffn_dim", default=4 * hidden),
        vocab=k.int("vocab_size"),
        seq=positions,
        max_positions=positions + 2,
        position="learned",
        activation=k.str("activation_function", "relu"),
        norm="layernorm",
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=bias,
        final_norm=k.bool("do_layer_norm_before", True)
        and not k.bool("_remove_final_layer_norm", False),
        tied_embeddings=k.bool("tie_word_embeddings", True),
    )


def _gpt_neox(k: _Keys) -> dict:
    hidden = k.int("hidden_size")
    heads = k.int("num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    bias = k.bool("attention_bias", True)
    return dict(
        layers=k.int("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        ffn=k.int("intermediate_size", default=4 * hidden),
        vocab=k.int("vocab_size"),
        seq=k.int("max_position_embeddings", default=2048),
        position="rope",
        rope_theta=k.float("rotary_emb_base", 10000.0),
        activation=k.str("hidden_act", "gelu"),
        norm="layernorm",
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=True,
        parallel_block=k.bool("use_parallel_residual", True),
        tied_embeddings=k.bool("tie_word_embeddings", False),
    )


def _bloom(k: _Keys) -> dict:
    hidden = k.int("hidden_size", "n_embed")
    heads = k.int("n_head", "num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    return dict(
        layers=k.int("n_layer", "num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        ffn=4 * hidden,
        vocab=k.int("vocab_size"),
        seq=k.int("seq_length", default=2048),
        position="alibi",
        activation="gelu",
        norm="layernorm",
        embed_norm=True,
        tied_embeddings=k.bool("tie_word_embeddings", True),
    )


def _falcon(k: _Keys) -> dict:
    hidden = k.int("hidden_size")
    heads = k.int("num_attention_heads", "n_head")
    _check_heads(k, hidden, heads, 0)
    new_arch = k.bool("new_decoder_architecture", False)
    parallel = k.bool("parallel_attn", True)
    if new_arch:
        kv = k.int("num_kv_heads", default=heads)
        norms = k.int("num_ln_in_parallel_attn", default=2)
    else:
        kv = 1 if k.bool("multi_query", True) else heads
        norms = 1 if parallel else 2
    if heads % kv:
        raise ConfigError("num_kv_heads", kv, f"a divisor of num_attention_heads({heads})")
    bias = k.bool("bias", False)
    return dict(
        layers=k.int("num_hidden_layers", "n_layer"),
        hidden=hidden,
        heads=heads,
        kv_heads=kv if kv != heads else 0,
        ffn=k.int("ffn_hidden_size", default=4 * hidden),
        vocab=k.int("vocab_size"),
        seq=k.int("max_position_embeddings", default=2048),
        position="alibi" if k.bool("alibi", False) else "rope",
        rope_theta=k.float("rope_theta", 10000.0),
        activation="gelu",
        norm="layernorm",
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=bias,
        parallel_block=new_arch or parallel,
        norms_per_block=norms,
        tied_embeddings=k.bool("tie_word_embeddings", True),
    )


def _rope_theta(k: _Keys, default: float) -> float:
    """rope_theta, or rope_parameters/rope_scaling's rope_theta, else the class default."""
    nested = _rope_scaling(k).get("rope_theta")
    return k.float(
        "rope_theta", float(nested) if isinstance(nested, (int, float)) and nested > 0 else default
    )


def _gqa(
    k: _Keys,
    *,
    hidden_default: int | None = None,
    heads_default: int | None = None,
    kv_default: int | None = None,
    head_dim_default: int | None = None,
) -> dict:
    """hidden, heads, kv_heads (0 = heads), head_dim (0 = hidden / heads) of a GQA model; a default of None makes
    hidden and heads required and kv_heads default to heads (multi-head attention)."""
    hidden = k.int("hidden_size", default=hidden_default)
    heads = k.int("num_attention_heads", default=heads_default)
    kv = k.int("num_key_value_heads", default=kv_default or heads)
    head_dim = (
        k.int("head_dim", default=head_dim_default or 0)
        if (k.data.get("head_dim") is not None or head_dim_default)
        else 0
    )
    if head_dim == hidden // heads and hidden % heads == 0:
        head_dim = 0
    _check_heads(k, hidden, heads, head_dim)
    if heads % kv:
        raise ConfigError(
            "num_key_value_heads",
            kv,
            f"a divisor of num_attention_heads({heads})",
            message=f"{k.path}: num_key_value_heads={kv} does not divide num_attention_heads={heads}",
        )
    return dict(hidden=hidden, heads=heads, kv_heads=kv if kv != heads else 0, head_dim=head_dim)


def _rope_attention_factor(k: _Keys) -> float:
    """YaRN's attention factor from rope_parameters / rope_scaling (rope_type or type "yarn"): its
    attention_factor, else spec.yarn_attention_factor of factor, mscale and mscale_all_dim; 1 for
    any other scaling (Llama 3's "llama3" rescales frequencies only)."""
    rope = _rope_scaling(k)
    if (rope.get("rope_type") or rope.get("type")) != "yarn":
        return 1.0
    sub = _Keys(rope, f"{k.path} rope_scaling", k.model_type)
    if rope.get("attention_factor") is not None:
        return sub.float("attention_factor", 1.0)
    mscale, all_dim = (sub.float(key, 1.0) if rope.get(key) else None for key in MSCALE_KEYS)
    return yarn_attention_factor(sub.float("factor", 1.0), mscale, all_dim)


MSCALE_KEYS = ("mscale", "mscale_all_dim")


def _rope_scaling(k: _Keys) -> dict:
    """The config's RoPE block: rope_parameters (transformers >= 4.56), else rope_scaling; {} when
    it states none. A block that is not a JSON object (a list, a string) is refused in one line,
    not read as no scaling."""
    for key in ROPE_KEYS:
        block = k.data.get(key)
        if block is not None and not isinstance(block, dict):
            raise ConfigError(
                key,
                block,
                "a JSON object (rope_type, factor, ...) or null",
                message=f"{k.path}: {key}={str(block)[:60]} is invalid: allowed a JSON object "
                "(rope_type, factor, ...) or null",
            )
    return k.data.get(ROPE_KEYS[0]) or k.data.get(ROPE_KEYS[1]) or {}


ROPE_KEYS = ("rope_parameters", "rope_scaling")
"""Where a config states its RoPE block, newest name first."""


def _rope_given(k: _Keys) -> bool:
    """The config states its RoPE scaling, if only as {} (else the family's transformers default
    applies: gpt-oss's GptOssConfig defaults to YaRN with factor 32)."""
    return any(k.data.get(key) is not None for key in ROPE_KEYS)


def _rope_model(k: _Keys, *, theta: float, positions: int, vocab: int) -> dict:
    """What every MoE family here shares: RoPE, RMSNorm, SwiGLU experts, untied by default."""
    return dict(
        position="rope",
        rope_theta=_rope_theta(k, theta),
        rope_attention_factor=_rope_attention_factor(k),
        norm="rmsnorm",
        gated_mlp=True,
        activation=k.str("hidden_act", "silu"),
        tied_embeddings=k.bool("tie_word_embeddings", False),
        seq=k.int("max_position_embeddings", default=positions),
        vocab=k.int("vocab_size", default=vocab),
    )


def _all_moe(k: _Keys) -> None:
    """Qwen's MoE placement keys, refused unless every block is MoE."""
    step = k.int("decoder_sparse_step", default=1)
    if step != 1:
        raise k.unsupported("decoder_sparse_step", step, "1 (every block MoE)")
    only = k.int_list("mlp_only_layers")
    if only:
        raise k.unsupported(
            "mlp_only_layers", only, "[] (dense blocks only before the first MoE block)"
        )


def _mixtral(k: _Keys) -> dict:
    fields = _gqa(k, hidden_default=4096, heads_default=32, kv_default=8) | _rope_model(
        k, theta=1e6, positions=131072, vocab=32000
    )
    window = k.int("sliding_window", default=0) if k.data.get("sliding_window") is not None else 0
    ffn = k.int("intermediate_size", default=14336)
    return fields | dict(
        layers=k.int("num_hidden_layers", default=32),
        ffn=ffn,
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
        sliding_window=window,
        moe=MoESpec(
            experts=k.int("num_local_experts", default=8),
            top_k=k.int("num_experts_per_tok", default=2),
            expert_ffn=ffn,
        ),
    )


def _qwen_moe(k: _Keys) -> dict:
    qwen2 = k.model_type == "qwen2_moe"
    layers = k.int("num_hidden_layers", default=24)
    _all_moe(k)
    fields = _gqa(
        k, hidden_default=2048, heads_default=16 if qwen2 else 32, kv_default=16 if qwen2 else 4
    ) | _rope_model(k, theta=10000.0, positions=32768, vocab=151936)
    window, window_layers = 0, None
    if k.bool("use_sliding_window", False):
        if not qwen2:
            raise k.unsupported("use_sliding_window", True, "false for qwen3_moe")
        window = k.int("sliding_window", default=4096)
        below = k.int("max_window_layers", default=28)
        window_layers = (
            k.window_layers(layers, [(i + 1) % 2 == 1 and i < below for i in range(layers)]) or None
        )
        window = window if window_layers else 0
    experts = k.int("num_experts", default=60 if qwen2 else 128)
    shared_ffn = k.int("shared_expert_intermediate_size", default=5632) if qwen2 else 0
    bias = k.bool("qkv_bias", True) if qwen2 else k.bool("attention_bias", False)
    return fields | dict(
        layers=layers,
        ffn=k.int("intermediate_size", default=5632 if qwen2 else 6144),
        qkv_bias=bias,
        out_bias=False if qwen2 else bias,
        mlp_bias=False,
        qk_norm=not qwen2,
        sliding_window=window,
        window_layers=window_layers if window else None,
        moe=MoESpec(
            experts=experts,
            top_k=k.int("num_experts_per_tok", default=4 if qwen2 else 8),
            expert_ffn=k.int("moe_intermediate_size", default=1408 if qwen2 else 768),
            shared_experts=1 if shared_ffn else 0,
            shared_expert_ffn=shared_ffn,
            shared_expert_gate=bool(shared_ffn),
            normalize_top_k=k.bool("norm_topk_prob", False),
        ),
    )


def _deepseek_v3(k: _Keys) -> dict:
    hidden = k.int("hidden_size", default=7168)
    heads = k.int("num_attention_heads", default=128)
    kv = k.int("num_key_value_heads", default=heads)
    if kv != heads:
        raise k.unsupported(
            "num_key_value_heads",
            kv,
            f"num_attention_heads ({heads}): MLA gives every head its key and value",
        )
    layers = k.int("num_hidden_layers", default=61)
    freq = k.int("moe_layer_freq", default=1)
    if freq != 1:
        raise k.unsupported(
            "moe_layer_freq", freq, "1 (every block after the first dense ones is MoE)"
        )
    first_dense = (
        k.int("first_k_dense_replace", default=3) if k.data.get("first_k_dense_replace") != 0 else 0
    )
    if first_dense >= layers:
        raise ConfigError(
            "first_k_dense_replace",
            first_dense,
            f"fewer than num_hidden_layers({layers})",
            message=f"{k.path}: first_k_dense_replace={first_dense} leaves no MoE block in "
            f"{layers} layers",
        )
    scoring = k.str("scoring_func", "sigmoid")
    if scoring not in ("sigmoid", "softmax"):
        raise k.unsupported("scoring_func", scoring, "sigmoid or softmax")
    method = k.str("topk_method", "noaux_tc")
    groups = k.int("n_group", default=8)
    experts = k.int("n_routed_experts", default=256)
    if experts % groups:
        raise ConfigError(
            "n_group",
            groups,
            f"a divisor of n_routed_experts({experts})",
            message=f"{k.path}: n_group={groups} does not divide n_routed_experts={experts}",
        )
    mtp = k.data.get("num_nextn_predict_layers", 0)
    mtp = 0 if mtp in (None, 0) else k.int("num_nextn_predict_layers")
    bias = k.bool("attention_bias", False)
    fields = _rope_model(k, theta=10000.0, positions=4096, vocab=129280)
    return fields | dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=0,
        head_dim=0,
        ffn=k.int("intermediate_size", default=18432),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=False,
        mtp_modules=mtp,
        mla=MLASpec(
            q_lora_rank=k.optional_int("q_lora_rank", 1536) or 0,
            kv_lora_rank=k.int("kv_lora_rank", default=512),
            qk_rope_head_dim=k.int("qk_rope_head_dim", default=64),
            qk_nope_head_dim=k.int("qk_nope_head_dim", default=128),
            v_head_dim=k.int("v_head_dim", default=128),
        ),
        moe=MoESpec(
            experts=experts,
            top_k=k.int("num_experts_per_tok", default=8),
            expert_ffn=k.int("moe_intermediate_size", default=2048),
            shared_experts=k.int("n_shared_experts", default=1)
            if k.data.get("n_shared_experts") != 0
            else 0,
            first_dense_layers=first_dense,
            router=scoring,
            normalize_top_k=k.bool("norm_topk_prob", True),
            routed_scaling=k.float("routed_scaling_factor", 2.5),
            aux_free_bias=method == "noaux_tc",
            expert_groups=groups,
            groups_per_token=k.int("topk_group", default=4),
        ),
    )


def _gpt_oss(k: _Keys) -> dict:
    layers = k.int("num_hidden_layers", default=36)
    fields = _gqa(
        k, hidden_default=2880, heads_default=64, kv_default=8, head_dim_default=64
    ) | _rope_model(k, theta=150000.0, positions=131072, vocab=201088)
    window = (
        k.int("sliding_window", default=128) if k.data.get("sliding_window", 128) is not None else 0
    )
    window_layers = (
        k.window_layers(layers, [(i + 1) % 2 == 1 for i in range(layers)]) if window else ()
    )
    ffn = k.int("intermediate_size", default=2880)
    bias = k.bool("attention_bias", True)
    return fields | dict(
        layers=layers,
        ffn=ffn,
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=True,
        attention_sinks=True,
        activation_clamp=k.float("swiglu_limit", 7.0),
        **({} if _rope_given(k) else {"rope_attention_factor": yarn_attention_factor(32.0)}),
        sliding_window=window if window_layers else 0,
        window_layers=window_layers or None,
        moe=MoESpec(
            experts=k.int("num_local_experts", default=128),
            top_k=k.int("num_experts_per_tok", "experts_per_token", default=4),
            expert_ffn=ffn,
            router_bias=True,
        ),
    )


_READERS = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
    "gpt2": _gpt2,
    "opt": _opt,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "falcon": _falcon,
    "qwen3": _qwen3,
    "phi3": _phi3,
    "gemma": _gemma,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt_oss": _gpt_oss,
}
