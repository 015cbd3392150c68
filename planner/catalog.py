"""Named models: `get(name) -> TransformerSpec`, `names() -> list[str]`.

Sources (the shape of every entry comes from its paper or released config):
- GPT-3 family: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (n_layers,
  d_model, n_heads, d_head; n_ctx 2048, d_ff = 4 d_model). Vocabulary 50257: GPT-3 uses GPT-2's
  byte-level BPE (Sec. 2.1 / Radford et al. 2019), and 50257 is what the published 175B size and
  FlopCounterMode's 2.2044e15 FLOPs per 2048-token sequence (docs/executor-notes.md) correspond to.
  Megatron pads it to 51200 for tensor parallelism; the megatron-* entries use 51200.
  Table 2.1 gives GPT-3 XL 24 heads of 128, which does not multiply to its d_model 2048 (it
  would make 1.5B parameters, not 1.3B); we use 16 heads of 128 = 2048, which gives the published
  1.3B. GPT-3 13B keeps Table 2.1's d_model 5140 with 40 heads of 128 (attention width 5120).
  GPT architecture: learned positions, pre-LN LayerNorm, GELU MLP, biases, tied embeddings.
- Megatron-LM weak scaling: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", Table 1 (heads, hidden, layers); vocabulary 51200 and
  sequence 2048 as stated in Sec. 5.1; same GPT architecture.
- Llama 2: Touvron et al. 2023, "Llama 2", Table 1 and the released params.json / HF configs
  (7B: 32 x 4096, 32 heads, ffn 11008; 13B: 40 x 5120, 40 heads, ffn 13824; 70B: 80 x 8192,
  64 heads, 8 KV heads, ffn 28672; vocab 32000, context 4096; RMSNorm, SwiGLU, RoPE, untied).
- Llama 3: Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3 (8B: 32 x 4096, ffn
  14336; 70B: 80 x 8192, ffn 28672; 405B: 126 x 16384, ffn 53248, 128 heads; all 8 KV heads,
  vocab 128256, RoPE theta 500000), context 8192.
- GPT-2: Radford et al. 2019, Table 2 and the released HF configs (n_ctx 1024, vocab 50257,
  gelu_new, tied).
- BERT-large: Devlin et al. 2019 (L=24, H=1024, A=16, 512 positions, 2 token types, vocab 30522
  (uncased), post-LN with an embedding LayerNorm, pooler and MLM head).
- T5-3B: Raffel et al. 2020, Table 14 and the released config (24 + 24 blocks, d_model 1024,
  32 heads of 128, d_ff 16384, vocab 32128, relative position bias, RMSNorm without bias, ReLU,
  no biases, tied embeddings).
"""
from __future__ import annotations

from planner.errors import ConfigError
from planner.spec import TransformerSpec

_BROWN = "Brown et al. 2020, Table 2.1"
_NARAYANAN = "Narayanan et al. 2021, Table 1"


def _gpt(name: str, layers: int, hidden: int, heads: int, *, vocab: int, seq: int, source: str,
         head_dim: int = 0, model_type: str = "gpt2", activation: str = "gelu") -> TransformerSpec:
    return TransformerSpec(name=name, model_type=model_type, layers=layers, hidden=hidden, heads=heads,
                           head_dim=head_dim, ffn=4 * hidden, vocab=vocab, seq=seq, max_positions=seq, position="learned",
                           activation=activation, norm="layernorm", tied_embeddings=True,
                           extras=(("source", source),))


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, *, vocab: int, seq: int,
           theta: float, source: str) -> TransformerSpec:
    return TransformerSpec(name=name, model_type="llama", layers=layers, hidden=hidden, heads=heads,
                           kv_heads=kv_heads, ffn=ffn, vocab=vocab, seq=seq, position="rope", rope_theta=theta,
                           gated_mlp=True, activation="silu", norm="rmsnorm", qkv_bias=False, out_bias=False,
                           mlp_bias=False, tied_embeddings=False, extras=(("source", source),))


def _build() -> dict[str, TransformerSpec]:
    entries: list[TransformerSpec] = []
    # GPT-3 (Brown et al. 2020, Table 2.1): name, n_layers, d_model, n_heads, d_head.
    for name, layers, hidden, heads, d_head in [
        ("gpt3-small", 12, 768, 12, 64), ("gpt3-medium", 24, 1024, 16, 64), ("gpt3-large", 24, 1536, 16, 96),
        ("gpt3-xl", 24, 2048, 16, 128), ("gpt3-2.7b", 32, 2560, 32, 80), ("gpt3-6.7b", 32, 4096, 32, 128),
        ("gpt3-13b", 40, 5140, 40, 128), ("gpt3-175b", 96, 12288, 96, 128),
    ]:
        entries.append(_gpt(name, layers, hidden, heads, head_dim=d_head, vocab=50257, seq=2048, source=_BROWN))
    # Megatron-LM weak scaling (Narayanan et al. 2021, Table 1): name, heads, hidden, layers.
    for name, heads, hidden, layers in [
        ("megatron-1.7b", 24, 2304, 24), ("megatron-3.6b", 32, 3072, 30), ("megatron-7.5b", 32, 4096, 36),
        ("megatron-18b", 48, 6144, 40), ("megatron-39b", 64, 8192, 48), ("megatron-76b", 80, 10240, 60),
        ("megatron-145b", 96, 12288, 80), ("megatron-310b", 128, 16384, 96), ("megatron-530b", 128, 20480, 105),
        ("megatron-1t", 160, 25600, 128),
    ]:
        entries.append(_gpt(name, layers, hidden, heads, vocab=51200, seq=2048, source=_NARAYANAN))
    # Llama 2 (Touvron et al. 2023) and Llama 3 (Grattafiori et al. 2024, Table 3).
    entries += [
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, vocab=32000, seq=4096, theta=1e4, source="Touvron et al. 2023, Table 1"),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, vocab=32000, seq=4096, theta=1e4, source="Touvron et al. 2023, Table 1"),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, vocab=32000, seq=4096, theta=1e4, source="Touvron et al. 2023, Table 1"),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, vocab=128256, seq=8192, theta=5e5, source="Grattafiori et al. 2024, Table 3"),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, vocab=128256, seq=8192, theta=5e5, source="Grattafiori et al. 2024, Table 3"),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, vocab=128256, seq=8192, theta=5e5, source="Grattafiori et al. 2024, Table 3"),
    ]
    # GPT-2 (Radford et al. 2019, Table 2; HF configs).
    for name, layers, hidden, heads in [("gpt2", 12, 768, 12), ("gpt2-medium", 24, 1024, 16),
                                        ("gpt2-large", 36, 1280, 20), ("gpt2-xl", 48, 1600, 25)]:
        entries.append(_gpt(name, layers, hidden, heads, vocab=50257, seq=1024, activation="gelu_new",
                            source="Radford et al. 2019, Table 2"))
    entries.append(TransformerSpec(
        name="bert-large", model_type="bert", layers=24, hidden=1024, heads=16, ffn=4096, vocab=30522, seq=512,
        position="learned", max_positions=512, type_vocab=2, embed_norm=True, final_norm=False, pooler=True,
        mlm_head=True, causal=False, tied_embeddings=True, activation="gelu",
        extras=(("source", "Devlin et al. 2019, Sec. 3 (BERT-LARGE)"),)))
    entries.append(TransformerSpec(
        name="t5-3b", model_type="t5", layers=24, encoder_layers=24, hidden=1024, heads=32, head_dim=128,
        ffn=16384, vocab=32128, seq=512, position="relative", norm="rmsnorm", activation="relu", qkv_bias=False,
        out_bias=False, mlp_bias=False, tied_embeddings=True,
        extras=(("source", "Raffel et al. 2020, Table 14; released t5-3b config"),)))
    return {spec.name: spec for spec in entries}


CATALOG: dict[str, TransformerSpec] = _build()


def names() -> list[str]:
    """Catalog names in definition order."""
    return list(CATALOG)


def get(name: str) -> TransformerSpec:
    """The catalog entry `name`; ConfigError naming the known models otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ConfigError("MODEL", name, "a catalog name (" + ", ".join(CATALOG) + "), a config.json path "
                          "or package.module:factory") from None
