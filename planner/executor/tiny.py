"""Small reference models for executor tests and the regret benchmark (torchtitan's 'debugmodel').

Usable as MODEL `planner.executor.tiny:gpt_tiny` in a plan document: a factory returning the
planner's own `Transformer`, which the executor parallelizes by module name.
"""

from __future__ import annotations

from planner.models.transformer import Transformer, build_model
from planner.spec import MLASpec, MoESpec, TransformerSpec


def gpt_tiny_spec(
    *, layers: int = 4, hidden: int = 32, heads: int = 4, vocab: int = 256, seq: int = 32
) -> TransformerSpec:
    """GPT-2 shaped (learned positions, LayerNorm, GELU MLP, biases), untied so stages split cleanly."""
    return TransformerSpec(
        name="gpt-tiny",
        model_type="gpt2",
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq=seq,
        tied_embeddings=False,
    )


def llama_tiny_spec(
    *,
    layers: int = 4,
    hidden: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 256,
    seq: int = 32,
) -> TransformerSpec:
    """Llama shaped (rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases)."""
    return TransformerSpec(
        name="llama-tiny",
        model_type="llama",
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=3 * hidden,
        vocab=vocab,
        seq=seq,
        position="rope",
        gated_mlp=True,
        activation="silu",
        norm="rmsnorm",
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
        tied_embeddings=False,
    )


def mixtral_tiny_spec(
    *, layers: int = 2, hidden: int = 32, experts: int = 4, seq: int = 32
) -> TransformerSpec:
    """Mixtral shaped (Jiang et al. 2024): the Llama block with a mixture of SwiGLU experts (softmax
    router, top-2, renormalized) in place of the MLP."""
    return llama_tiny_spec(layers=layers, hidden=hidden, seq=seq).with_(
        name="mixtral-tiny",
        model_type="mixtral",
        moe=MoESpec(experts=experts, top_k=2, expert_ffn=2 * hidden),
    )


def deepseek_tiny_spec(*, seq: int = 32) -> TransformerSpec:
    """DeepSeek-V3 shaped (report Sec. 2.1): multi-head latent attention, one dense block, then 8 routed
    experts (sigmoid scores, group-limited top-2 over 4 groups, balancing bias, scaling 2.5) and a
    shared expert."""
    return llama_tiny_spec(layers=3, hidden=32, seq=seq).with_(
        name="deepseek-tiny",
        model_type="deepseek_v3",
        kv_heads=0,
        ffn=64,
        mla=MLASpec(
            q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8
        ),
        moe=MoESpec(
            experts=8,
            top_k=2,
            expert_ffn=16,
            shared_experts=1,
            first_dense_layers=1,
            router="sigmoid",
            routed_scaling=2.5,
            aux_free_bias=True,
            expert_groups=4,
            groups_per_token=2,
        ),
    )


def gpt_tiny() -> Transformer:
    """4 blocks, hidden 32, 4 heads, vocab 256, seq 32 (about 70k parameters)."""
    return build_model(gpt_tiny_spec(), device="meta", seed=None)


def gpt_small() -> Transformer:
    """8 blocks, hidden 64, 4 heads, vocab 512, seq 64: the regret benchmark's model."""
    return build_model(
        gpt_tiny_spec(layers=8, hidden=64, heads=4, vocab=512, seq=64), device="meta", seed=None
    )


def llama_tiny() -> Transformer:
    """4 blocks, hidden 32, 4 query / 2 key-value heads, vocab 256, seq 32."""
    return build_model(llama_tiny_spec(), device="meta", seed=None)


def mixtral_tiny() -> Transformer:
    """2 blocks, hidden 32, 4 query / 2 key-value heads, 4 SwiGLU experts of width 64, top-2."""
    return build_model(mixtral_tiny_spec(), device="meta", seed=None)


def deepseek_tiny() -> Transformer:
    """3 blocks (1 dense), hidden 32, MLA, 8 routed experts of width 16 (top-2 of 2 groups of 4) + 1 shared."""
    return build_model(deepseek_tiny_spec(), device="meta", seed=None)
