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
- Mixture-of-experts models (validation/models/moe_models.json gathers every value with its source;
  tests/test_moe_models.py holds each entry equal to reading its config.json fixture):
  Mixtral 8x7B and 8x22B (Jiang et al. 2024, "Mixtral of Experts", Sec. 2 and Table 1; released
  config.json / params.json: 32 x 4096 and 56 x 6144, 32/48 heads of 128, 8 KV heads, 8 SwiGLU
  experts of 14336 / 16384, top-2, vocab 32000, rope theta 1e6);
  Qwen3-30B-A3B and Qwen3-235B-A22B (Qwen Team 2025, "Qwen3 Technical Report", Table 2, and the
  model cards: 48 x 2048 / 94 x 4096, 32/64 heads of 128, 4 KV heads, QK-norm, 128 experts of
  768 / 1536, top-8 renormalized, vocab 151936, rope theta 1e6);
  DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 2.1-2.2 and 4.2: 61 x 7168,
  128 heads with MLA (q latent 1536, kv latent 512, rope 64, nope 128, v 128), 3 dense blocks of
  ffn 18432, then 256 routed experts of 2048 top-8 (sigmoid, aux-loss-free bias, 8 groups of which
  4 per token, scaling 2.5) + 1 shared expert, one MTP module, vocab 129280);
  gpt-oss-120b (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", Sec. 2.1-2.3: 36 x 2880, 64
  heads of 64, 8 KV heads, banded window of 128 on the even blocks, attention sinks, biases, 128
  experts of 2880 top-4 with router and expert biases, vocab 201088, rope theta 150000; released
  config.json: YaRN factor 32 without mscale, so an attention factor of 0.1 ln 32 + 1, and
  swiglu_limit 7.0).
  Default sequence 4096: the pre-training length of DeepSeek-V3 (Sec. 4.2), Qwen3 (Sec. 3.1,
  general stage) and gpt-oss (initial_context_length), and of every published MoE run in
  validation/published/moe.json; Mixtral's paper states a 32k context (use --seq).
"""

from __future__ import annotations

from planner.errors import ConfigError
from planner.spec import MLASpec, MoESpec, TransformerSpec, yarn_attention_factor

_BROWN = "Brown et al. 2020, Table 2.1"
_NARAYANAN = "Narayanan et al. 2021, Table 1"


def _gpt(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    *,
    vocab: int,
    seq: int,
    source: str,
    head_dim: int = 0,
    model_type: str = "gpt2",
    activation: str = "gelu",
) -> TransformerSpec:
    return TransformerSpec(
        name=name,
        model_type=model_type,
        layers=layers,
        hidden=hidden,
        heads=heads,
        head_dim=head_dim,
        ffn=4 * hidden,
        vocab=vocab,
        seq=seq,
        max_positions=seq,
        position="learned",
        activation=activation,
        norm="layernorm",
        tied_embeddings=True,
        extras=(("source", source),),
    )


def _llama(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    *,
    vocab: int,
    seq: int,
    theta: float,
    source: str,
) -> TransformerSpec:
    return TransformerSpec(
        name=name,
        model_type="llama",
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=vocab,
        seq=seq,
        position="rope",
        rope_theta=theta,
        gated_mlp=True,
        activation="silu",
        norm="rmsnorm",
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
        tied_embeddings=False,
        extras=(("source", source),),
    )


def _build() -> dict[str, TransformerSpec]:
    entries = [
        *_gpt3_entries(),
        *_megatron_entries(),
        *_llama_entries(),
        *_gpt2_entries(),
        _bert_large(),
        _t5_3b(),
        *_moe_entries(),
    ]
    return {spec.name: spec for spec in entries}


def _gpt3_entries() -> list[TransformerSpec]:
    """GPT-3 (Brown et al. 2020, Table 2.1): name, n_layers, d_model, n_heads, d_head."""
    return [
        _gpt(name, layers, hidden, heads, head_dim=d_head, vocab=50257, seq=2048, source=_BROWN)
        for name, layers, hidden, heads, d_head in [
            ("gpt3-small", 12, 768, 12, 64),
            ("gpt3-medium", 24, 1024, 16, 64),
            ("gpt3-large", 24, 1536, 16, 96),
            ("gpt3-xl", 24, 2048, 16, 128),
            ("gpt3-2.7b", 32, 2560, 32, 80),
            ("gpt3-6.7b", 32, 4096, 32, 128),
            ("gpt3-13b", 40, 5140, 40, 128),
            ("gpt3-175b", 96, 12288, 96, 128),
        ]
    ]


def _megatron_entries() -> list[TransformerSpec]:
    """Megatron-LM weak scaling (Narayanan et al. 2021, Table 1): name, heads, hidden, layers."""
    return [
        _gpt(name, layers, hidden, heads, vocab=51200, seq=2048, source=_NARAYANAN)
        for name, heads, hidden, layers in [
            ("megatron-1.7b", 24, 2304, 24),
            ("megatron-3.6b", 32, 3072, 30),
            ("megatron-7.5b", 32, 4096, 36),
            ("megatron-18b", 48, 6144, 40),
            ("megatron-39b", 64, 8192, 48),
            ("megatron-76b", 80, 10240, 60),
            ("megatron-145b", 96, 12288, 80),
            ("megatron-310b", 128, 16384, 96),
            ("megatron-530b", 128, 20480, 105),
            ("megatron-1t", 160, 25600, 128),
        ]
    ]


def _llama_entries() -> list[TransformerSpec]:
    """Llama 2 (Touvron et al. 2023, Table 1) and Llama 3 (Grattafiori et al. 2024, Table 3):
    name, layers, hidden, heads, kv_heads, ffn."""
    llama2 = dict(vocab=32000, seq=4096, theta=1e4, source="Touvron et al. 2023, Table 1")
    llama3 = dict(vocab=128256, seq=8192, theta=5e5, source="Grattafiori et al. 2024, Table 3")
    return [
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, **llama2),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, **llama2),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, **llama2),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, **llama3),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, **llama3),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, **llama3),
    ]


def _gpt2_entries() -> list[TransformerSpec]:
    """GPT-2 (Radford et al. 2019, Table 2; HF configs): name, layers, hidden, heads."""
    return [
        _gpt(
            name,
            layers,
            hidden,
            heads,
            vocab=50257,
            seq=1024,
            activation="gelu_new",
            source="Radford et al. 2019, Table 2",
        )
        for name, layers, hidden, heads in [
            ("gpt2", 12, 768, 12),
            ("gpt2-medium", 24, 1024, 16),
            ("gpt2-large", 36, 1280, 20),
            ("gpt2-xl", 48, 1600, 25),
        ]
    ]


def _bert_large() -> TransformerSpec:
    """BERT-large (Devlin et al. 2019, Sec. 3)."""
    return TransformerSpec(
        name="bert-large",
        model_type="bert",
        layers=24,
        hidden=1024,
        heads=16,
        ffn=4096,
        vocab=30522,
        seq=512,
        position="learned",
        max_positions=512,
        type_vocab=2,
        embed_norm=True,
        final_norm=False,
        pooler=True,
        mlm_head=True,
        causal=False,
        tied_embeddings=True,
        activation="gelu",
        extras=(("source", "Devlin et al. 2019, Sec. 3 (BERT-LARGE)"),),
    )


def _t5_3b() -> TransformerSpec:
    """T5-3B (Raffel et al. 2020, Table 14; released config)."""
    return TransformerSpec(
        name="t5-3b",
        model_type="t5",
        layers=24,
        encoder_layers=24,
        hidden=1024,
        heads=32,
        head_dim=128,
        ffn=16384,
        vocab=32128,
        seq=512,
        position="relative",
        norm="rmsnorm",
        activation="relu",
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
        tied_embeddings=True,
        extras=(("source", "Raffel et al. 2020, Table 14; released t5-3b config"),),
    )


_MOE_COMMON = dict(
    position="rope",
    norm="rmsnorm",
    gated_mlp=True,
    activation="silu",
    tied_embeddings=False,
    seq=4096,
    qkv_bias=False,
    out_bias=False,
    mlp_bias=False,
)
"""What the MoE entries share: RoPE, RMSNorm, SwiGLU, untied, no biases, sequence 4096
(module docstring)."""


def _moe_entries() -> list[TransformerSpec]:
    """The mixture-of-experts entries (module docstring for sources)."""
    return [*_mixtral_entries(), *_qwen3_moe_entries(), _deepseek_v3(), _gpt_oss_120b()]


def _mixtral_entries() -> list[TransformerSpec]:
    """Mixtral 8x7B and 8x22B (Jiang et al. 2024)."""
    mixtral_src = "Jiang et al. 2024, Mixtral of Experts, Sec. 2 / Table 1; released config.json"
    return [
        TransformerSpec(
            name="mixtral-8x7b",
            model_type="mixtral",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=14336,
            vocab=32000,
            rope_theta=1e6,
            moe=MoESpec(experts=8, top_k=2, expert_ffn=14336),
            extras=(("source", mixtral_src),),
            **_MOE_COMMON,
        ),
        TransformerSpec(
            name="mixtral-8x22b",
            model_type="mixtral",
            layers=56,
            hidden=6144,
            heads=48,
            kv_heads=8,
            ffn=16384,
            vocab=32000,
            rope_theta=1e6,
            moe=MoESpec(experts=8, top_k=2, expert_ffn=16384),
            extras=(("source", mixtral_src),),
            **_MOE_COMMON,
        ),
    ]


def _qwen3_moe_entries() -> list[TransformerSpec]:
    """Qwen3-30B-A3B and Qwen3-235B-A22B (Qwen Team 2025)."""
    qwen3_src = "Qwen Team 2025, Qwen3 Technical Report, Table 2; Qwen3 model cards and config.json"
    return [
        TransformerSpec(
            name="qwen3-30b-a3b",
            model_type="qwen3_moe",
            layers=48,
            hidden=2048,
            heads=32,
            kv_heads=4,
            head_dim=128,
            ffn=6144,
            vocab=151936,
            rope_theta=1e6,
            qk_norm=True,
            moe=MoESpec(experts=128, top_k=8, expert_ffn=768),
            extras=(("source", qwen3_src),),
            **_MOE_COMMON,
        ),
        TransformerSpec(
            name="qwen3-235b-a22b",
            model_type="qwen3_moe",
            layers=94,
            hidden=4096,
            heads=64,
            kv_heads=4,
            head_dim=128,
            ffn=12288,
            vocab=151936,
            rope_theta=1e6,
            qk_norm=True,
            moe=MoESpec(experts=128, top_k=8, expert_ffn=1536),
            extras=(("source", qwen3_src),),
            **_MOE_COMMON,
        ),
    ]


def _deepseek_v3() -> TransformerSpec:
    """DeepSeek-V3 (DeepSeek-AI 2024): MLA, 3 dense blocks, 256 routed experts, one MTP module."""
    return TransformerSpec(
        name="deepseek-v3",
        model_type="deepseek_v3",
        layers=61,
        hidden=7168,
        heads=128,
        ffn=18432,
        vocab=129280,
        rope_theta=1e4,
        mtp_modules=1,
        mla=MLASpec(
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
        ),
        moe=MoESpec(
            experts=256,
            top_k=8,
            expert_ffn=2048,
            shared_experts=1,
            first_dense_layers=3,
            router="sigmoid",
            routed_scaling=2.5,
            aux_free_bias=True,
            expert_groups=8,
            groups_per_token=4,
        ),
        extras=(
            (
                "source",
                "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, Sec. 2.1-2.2, 4.2; "
                "released config.json",
            ),
        ),
        **_MOE_COMMON,
    )


def _gpt_oss_120b() -> TransformerSpec:
    """gpt-oss-120b (OpenAI 2025): banded window on the even blocks, attention sinks, biases."""
    return TransformerSpec(
        name="gpt-oss-120b",
        model_type="gpt_oss",
        layers=36,
        hidden=2880,
        heads=64,
        kv_heads=8,
        head_dim=64,
        ffn=2880,
        vocab=201088,
        rope_theta=150000.0,
        sliding_window=128,
        window_layers=tuple(range(0, 36, 2)),
        attention_sinks=True,
        rope_attention_factor=yarn_attention_factor(32.0),
        activation_clamp=7.0,
        moe=MoESpec(experts=128, top_k=4, expert_ffn=2880, router_bias=True),
        extras=(
            (
                "source",
                "OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card, Sec. 2.1-2.3; released config.json",
            ),
        ),
        **(_MOE_COMMON | dict(qkv_bias=True, out_bias=True, mlp_bias=True)),
    )


CATALOG: dict[str, TransformerSpec] = _build()


def names() -> list[str]:
    """Catalog names in definition order."""
    return list(CATALOG)


def get(name: str) -> TransformerSpec:
    """The catalog entry `name`; ConfigError naming the known models otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ConfigError(
            "MODEL",
            name,
            "a catalog name (" + ", ".join(CATALOG) + "), a config.json path "
            "or package.module:factory",
        ) from None
