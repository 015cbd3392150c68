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

Every problem (not JSON, not an object, unknown model_type, a missing or non-positive size) is a
`ConfigError` naming the key.
"""
from __future__ import annotations

from pathlib import Path

from planner.errors import ConfigError
from planner.spec import TransformerSpec

MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "opt", "gpt_neox", "bloom", "falcon")


class _Keys:
    """Typed access to the config's keys; errors name the key and the file."""

    def __init__(self, data: dict, path: str, model_type: str):
        self.data, self.path, self.model_type = data, path, model_type

    def _missing(self, key: str) -> ConfigError:
        return ConfigError(key, None, "a positive integer",
                           message=f"{self.path}: {key} is missing (required for model_type {self.model_type!r})")

    def int(self, *keys: str, default: int | None = None) -> int:
        """The first present key among `keys`, a positive integer; `default` if none is present."""
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(key, value, "a positive integer",
                                  message=f"{self.path}: {key}={value!r} is invalid: allowed a positive integer")
            return value
        if default is None:
            raise self._missing(keys[0])
        return default

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(key, value, "true or false", message=f"{self.path}: {key}={value!r} is invalid: allowed true or false")
        return value

    def str(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(key, value, "a string", message=f"{self.path}: {key}={value!r} is invalid: allowed a string")
        return value

    def float(self, key: str, default: float) -> float:
        value = self.data.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(key, value, "a positive number", message=f"{self.path}: {key}={value!r} is invalid: allowed a positive number")
        return float(value)


def load_json(path: str | Path) -> dict:
    """The JSON object in `path` (planner.io.read_json): ConfigError for a missing, empty, malformed,
    non-strict, too deeply nested or non-object file."""
    from planner.io import read_json

    return read_json(path, "config.json")


def read_hf_config(path: str | Path, *, seq: int | None = None) -> TransformerSpec:
    """Parse `path` (a HF config.json) into a TransformerSpec named after the file."""
    data = load_json(path)
    return spec_from_dict(data, name=str(path), seq=seq)


DEFAULT_SEQ_CAP = 8192
"""Default training length of RoPE models whose max_position_embeddings is longer (pass --seq)."""


def spec_from_dict(data: dict, *, name: str, seq: int | None = None) -> TransformerSpec:
    """Map a config dict onto a TransformerSpec (see the module docstring for keys and defaults)."""
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError("model_type", model_type, "one of " + ", ".join(MODEL_TYPES),
                          message=f"{name}: model_type={model_type!r} is not supported: allowed "
                                  + ", ".join(MODEL_TYPES))
    k = _Keys(data, name, model_type)
    fields = _READERS[model_type](k)
    default_seq = fields.pop("seq")
    max_positions = fields.get("max_positions", 0)
    if seq is not None and fields.get("position") == "learned" and max_positions and seq > max_positions:
        raise ConfigError("seq", seq, f"at most {max_positions} (rows of the learned position table of {name})")
    extras = (("source", name), ("model_type", model_type))
    if seq is None and fields.get("position") != "learned" and default_seq > DEFAULT_SEQ_CAP:
        # a RoPE model's max_position_embeddings is the context it was extended to, not the length it
        # is trained at (Llama 3.1: 131072, pre-trained at 8192, Dubey et al. 2024 Sec. 3.4; Qwen2:
        # 32768-131072): planning for it by default would put a 16x longer sequence in every estimate
        extras += (("seq_default_capped_from", default_seq),)
        default_seq = DEFAULT_SEQ_CAP
    return TransformerSpec(name=name, model_type=model_type, seq=seq or default_seq, extras=extras, **fields)


def _check_heads(k: _Keys, hidden: int, heads: int, head_dim: int) -> None:
    if not head_dim and hidden % heads:
        raise ConfigError("num_attention_heads", heads, f"a divisor of hidden_size({hidden})",
                          message=f"{k.path}: num_attention_heads={heads} does not divide hidden_size={hidden}")


def _llama_like(k: _Keys) -> dict:
    hidden = k.int("hidden_size")
    heads = k.int("num_attention_heads")
    kv = k.int("num_key_value_heads", default=heads)
    head_dim = k.int("head_dim", default=0) if k.data.get("head_dim") is not None else 0
    if head_dim == hidden // heads and hidden % heads == 0:
        head_dim = 0
    _check_heads(k, hidden, heads, head_dim)
    if heads % kv:
        raise ConfigError("num_key_value_heads", kv, f"a divisor of num_attention_heads({heads})",
                          message=f"{k.path}: num_key_value_heads={kv} does not divide num_attention_heads={heads}")
    rope = k.data.get("rope_parameters") or k.data.get("rope_scaling") or {}
    theta = k.float("rope_theta", float(rope.get("rope_theta", 10000.0)) if isinstance(rope, dict) else 10000.0)
    qwen = k.model_type == "qwen2"
    attention_bias = k.bool("attention_bias", False)
    window = k.data.get("sliding_window") if k.model_type == "mistral" else None
    return dict(
        layers=k.int("num_hidden_layers"), hidden=hidden, heads=heads, kv_heads=kv if kv != heads else 0,
        head_dim=head_dim, ffn=k.int("intermediate_size"), vocab=k.int("vocab_size"),
        seq=k.int("max_position_embeddings", default=2048), position="rope", rope_theta=theta,
        gated_mlp=True, activation=k.str("hidden_act", "silu"), norm="rmsnorm",
        qkv_bias=True if qwen else attention_bias, out_bias=False if qwen else attention_bias,
        mlp_bias=k.bool("mlp_bias", False), tied_embeddings=k.bool("tie_word_embeddings", False),
        sliding_window=window if isinstance(window, int) and window > 0 else 0,
    )


def _gpt2(k: _Keys) -> dict:
    hidden = k.int("n_embd", "hidden_size")
    heads = k.int("n_head", "num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    positions = k.int("n_positions", "max_position_embeddings")
    return dict(
        layers=k.int("n_layer", "num_hidden_layers"), hidden=hidden, heads=heads,
        ffn=k.int("n_inner", default=4 * hidden), vocab=k.int("vocab_size"), seq=positions,
        max_positions=positions, position="learned", activation=k.str("activation_function", "gelu_new"),
        norm="layernorm", tied_embeddings=k.bool("tie_word_embeddings", True),
    )


def _opt(k: _Keys) -> dict:
    hidden = k.int("hidden_size")
    heads = k.int("num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    proj = k.int("word_embed_proj_dim", default=hidden)
    if proj != hidden:
        raise ConfigError("word_embed_proj_dim", proj, f"equal to hidden_size({hidden}); OPT's project_in/out "
                          "layers are not modelled",
                          message=f"{k.path}: word_embed_proj_dim={proj} != hidden_size={hidden} is not supported "
                                  "(OPT-350m's embedding projections are not modelled)")
    positions = k.int("max_position_embeddings", default=2048)
    bias = k.bool("enable_bias", True)
    return dict(
        layers=k.int("num_hidden_layers"), hidden=hidden, heads=heads, ffn=k.int("ffn_dim", default=4 * hidden),
        vocab=k.int("vocab_size"), seq=positions, max_positions=positions + 2, position="learned",
        activation=k.str("activation_function", "relu"), norm="layernorm", qkv_bias=bias, out_bias=bias,
        mlp_bias=bias, final_norm=k.bool("do_layer_norm_before", True) and not k.bool("_remove_final_layer_norm", False),
        tied_embeddings=k.bool("tie_word_embeddings", True),
    )


def _gpt_neox(k: _Keys) -> dict:
    hidden = k.int("hidden_size")
    heads = k.int("num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    bias = k.bool("attention_bias", True)
    return dict(
        layers=k.int("num_hidden_layers"), hidden=hidden, heads=heads, ffn=k.int("intermediate_size", default=4 * hidden),
        vocab=k.int("vocab_size"), seq=k.int("max_position_embeddings", default=2048), position="rope",
        rope_theta=k.float("rotary_emb_base", 10000.0), activation=k.str("hidden_act", "gelu"), norm="layernorm",
        qkv_bias=bias, out_bias=bias, mlp_bias=True, parallel_block=k.bool("use_parallel_residual", True),
        tied_embeddings=k.bool("tie_word_embeddings", False),
    )


def _bloom(k: _Keys) -> dict:
    hidden = k.int("hidden_size", "n_embed")
    heads = k.int("n_head", "num_attention_heads")
    _check_heads(k, hidden, heads, 0)
    return dict(
        layers=k.int("n_layer", "num_hidden_layers"), hidden=hidden, heads=heads, ffn=4 * hidden,
        vocab=k.int("vocab_size"), seq=k.int("seq_length", default=2048), position="alibi", activation="gelu",
        norm="layernorm", embed_norm=True, tied_embeddings=k.bool("tie_word_embeddings", True),
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
        layers=k.int("num_hidden_layers", "n_layer"), hidden=hidden, heads=heads, kv_heads=kv if kv != heads else 0,
        ffn=k.int("ffn_hidden_size", default=4 * hidden), vocab=k.int("vocab_size"),
        seq=k.int("max_position_embeddings", default=2048), position="alibi" if k.bool("alibi", False) else "rope",
        rope_theta=k.float("rope_theta", 10000.0), activation="gelu", norm="layernorm", qkv_bias=bias,
        out_bias=bias, mlp_bias=bias, parallel_block=new_arch or parallel, norms_per_block=norms,
        tied_embeddings=k.bool("tie_word_embeddings", True),
    )


_READERS = {"llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like, "gpt2": _gpt2, "opt": _opt,
            "gpt_neox": _gpt_neox, "bloom": _bloom, "falcon": _falcon}
