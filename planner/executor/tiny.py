"""Small reference models for executor tests and the regret benchmark (torchtitan's 'debugmodel').

Usable as MODEL `planner.executor.tiny:gpt_tiny` in a plan document: a factory returning the
planner's own `Transformer`, which the executor parallelizes by module name.
"""
from __future__ import annotations

from planner.models.transformer import Transformer, build_model
from planner.spec import TransformerSpec


def gpt_tiny_spec(*, layers: int = 4, hidden: int = 32, heads: int = 4, vocab: int = 256,
                  seq: int = 32) -> TransformerSpec:
    """GPT-2 shaped (learned positions, LayerNorm, GELU MLP, biases), untied so stages split cleanly."""
    return TransformerSpec(name="gpt-tiny", model_type="gpt2", layers=layers, hidden=hidden, heads=heads,
                           vocab=vocab, seq=seq, tied_embeddings=False)


def llama_tiny_spec(*, layers: int = 4, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                    vocab: int = 256, seq: int = 32) -> TransformerSpec:
    """Llama shaped (rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases)."""
    return TransformerSpec(name="llama-tiny", model_type="llama", layers=layers, hidden=hidden, heads=heads,
                           kv_heads=kv_heads, ffn=3 * hidden, vocab=vocab, seq=seq, position="rope",
                           gated_mlp=True, activation="silu", norm="rmsnorm", qkv_bias=False,
                           out_bias=False, mlp_bias=False, tied_embeddings=False)


def gpt_tiny() -> Transformer:
    """4 blocks, hidden 32, 4 heads, vocab 256, seq 32 (about 70k parameters)."""
    return build_model(gpt_tiny_spec(), device="meta", seed=None)


def gpt_small() -> Transformer:
    """8 blocks, hidden 64, 4 heads, vocab 512, seq 64: the regret benchmark's model."""
    return build_model(gpt_tiny_spec(layers=8, hidden=64, heads=4, vocab=512, seq=64), device="meta", seed=None)


def llama_tiny() -> Transformer:
    """4 blocks, hidden 32, 4 query / 2 key-value heads, vocab 256, seq 32."""
    return build_model(llama_tiny_spec(), device="meta", seed=None)
