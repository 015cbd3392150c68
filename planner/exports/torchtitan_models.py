# --- planner: models torchtitan 0.3.0 does not ship, in its module conventions -----------------------
# A GPT-style decoder (learned positions, LayerNorm, GELU MLP, biases) and tied input/output embeddings
# across pipeline stages. Module names follow torchtitan's decoders (tok_embeddings, layers.<i> with
# attention.qkv_linear.wqkv / attention.wo / feed_forward.w1 / feed_forward.w2 / attention_norm /
# ffn_norm, norm, lm_head) plus pos_embeddings, so torchtitan's llama3 parallelize function (TP/SP
# from the sharding configs below, activation checkpointing, FSDP2) and pipeline_llm apply as they are.
import dataclasses
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import spmd_types as spmd

from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models.common import Embedding, LayerNorm, Linear
from torchtitan.models.common.attention import FusedQKVLinear
from torchtitan.models.common.config_utils import get_attention_config
from torchtitan.models.common.decoder import Decoder, TransformerBlock
from torchtitan.models.common.decoder_sharding import (
    colwise_config,
    dense_activation_placement,
    dense_param_placement,
    dense_sequence_parallel_placement,
    norm_config,
    pre_lm_head_norm_config,
    rowwise_config,
    set_decoder_sharding_config,
    set_gqa_inner_attention_local_map,
    set_qkv_linear_sharding,
)
from torchtitan.models.common.param_init import depth_scaled_std
from torchtitan.models.llama3.parallelize import parallelize_llama
from torchtitan.models.utils import get_dense_model_nparams_and_flops
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.protocols.module import Module
from torchtitan.protocols.sharding import ShardingConfig


class GeluFeedForward(Module):
    """w2(gelu(w1 x)) with biases (GPT-2/3 MLP)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        w1: Linear.Config
        w2: Linear.Config

    def __init__(self, config: Config):
        super().__init__()
        self.w1 = config.w1.build()
        self.w2 = config.w2.build()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class GPTAttention(Module):
    """Multi-head causal self-attention without rotary embeddings (positions are learned)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        n_heads: int
        n_kv_heads: int
        dim: int
        head_dim: int
        qkv_linear: FusedQKVLinear.Config
        wo: Linear.Config
        inner_attention: Module.Config

    def __init__(self, config: Config):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            config.n_heads,
            config.n_kv_heads,
            config.head_dim,
        )
        self.qkv_linear = config.qkv_linear.build()
        self.wo = config.wo.build()
        self.inner_attention = config.inner_attention.build()
        self.scaling = (
            self.head_dim**-0.5 if config.head_dim * config.n_heads != config.dim else None
        )

    def forward(self, x_BLD, attention_masks, positions=None):
        xq, xk, xv = self.qkv_linear(x_BLD)
        out = self.inner_attention(
            xq,
            xk,
            xv,
            attention_masks=attention_masks,
            scale=self.scaling,
            enable_gqa=self.n_heads > self.n_kv_heads,
        ).contiguous()
        return self.wo(out.flatten(2))


class GPTBlock(TransformerBlock):
    """Pre-LayerNorm block: x + attn(ln(x)), then + mlp(ln(.))."""

    @dataclass(kw_only=True, slots=True)
    class Config(TransformerBlock.Config):
        pass

    def __init__(self, config: Config):
        super().__init__()
        self.attention = config.attention.build()
        self.feed_forward = config.feed_forward.build()
        self.attention_norm = config.attention_norm.build()
        self.ffn_norm = config.ffn_norm.build()

    def forward(self, x, attention_masks, positions=None):
        h = x + self.attention(self.attention_norm(x), attention_masks, positions)
        return h + self.feed_forward(self.ffn_norm(h))


class PositionEmbedding(nn.Embedding, Module):
    """Learned absolute positions (a replicated table under tensor parallelism)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        num_embeddings: int
        embedding_dim: int

    def __init__(self, config: Config):
        super().__init__(config.num_embeddings, config.embedding_dim)


def _with_bias(cfg: ShardingConfig) -> ShardingConfig:
    """A norm's sharding with its bias placed like its weight (LayerNorm has both)."""
    states = dict(cfg.state_shardings)
    states["bias"] = states["weight"]
    return dataclasses.replace(cfg, state_shardings=states)


def set_gpt_sharding_config(config, *, enable_sp: bool) -> None:
    """Tensor/sequence-parallel placements, as torchtitan's llama3 sets them, with biases and positions."""
    set_decoder_sharding_config(config, enable_sp=enable_sp)
    config.norm.sharding_config = _with_bias(pre_lm_head_norm_config(enable_sp=enable_sp))
    act = (
        dense_sequence_parallel_placement() if enable_sp else dense_activation_placement(tp=spmd.I)
    )
    replicated = dense_activation_placement(tp=spmd.R)
    config.pos_embeddings.sharding_config = ShardingConfig(
        state_shardings={"weight": dense_param_placement(tp=spmd.R)},
        in_src_shardings={"input": replicated},
        in_dst_shardings={"input": replicated},
        out_src_shardings=replicated,
        out_dst_shardings=act,
    )
    for layer in config.layers:
        norm = _with_bias(norm_config(enable_sp=enable_sp))
        layer.attention_norm.sharding_config = norm
        layer.ffn_norm.sharding_config = norm
        layer.attention.sharding_config = ShardingConfig(
            in_src_shardings={"x_BLD": act}, in_dst_shardings={"x_BLD": replicated}
        )
        set_qkv_linear_sharding(layer.attention.qkv_linear)
        set_gqa_inner_attention_local_map(layer.attention.inner_attention)
        layer.attention.wo.sharding_config = rowwise_config(output_sp=enable_sp)
        ffn = layer.feed_forward
        ffn.sharding_config = ShardingConfig(
            in_src_shardings={"x": act}, in_dst_shardings={"x": replicated}
        )
        ffn.w1.sharding_config = colwise_config()
        ffn.w2.sharding_config = rowwise_config(output_sp=enable_sp)


def _check_runtime(config, *, heads: int, kv_heads: int, max_seq: int) -> None:
    """The checks torchtitan's Decoder.update_from_config makes, for models built here."""
    par = config.parallelism
    if par.spmd_backend == "spmd_types":
        raise NotImplementedError(
            "the planner's models run on torchtitan's DTensor backends "
            "(parallelism.spmd_backend partial_dtensor or full_dtensor)"
        )
    if par.tensor_parallel_degree > 1 and (
        heads % par.tensor_parallel_degree or kv_heads % par.tensor_parallel_degree
    ):
        raise ValueError(
            f"tensor_parallel_degree ({par.tensor_parallel_degree}) must divide the heads ({heads}, {kv_heads})"
        )
    seq_len = getattr(getattr(config, "training", None), "seq_len", None)
    if seq_len is not None and seq_len > max_seq:
        raise ValueError(f"training.seq_len {seq_len} exceeds the {max_seq} learned positions")


class GPTModel(Decoder):
    """GPT-2/3 decoder: token + learned position embeddings, pre-LN blocks, final LayerNorm, LM head."""

    @dataclass(kw_only=True, slots=True)
    class Config(Decoder.Config):
        pos_embeddings: PositionEmbedding.Config

        @property
        def max_seq_len(self) -> int:
            return self.pos_embeddings.num_embeddings

        def update_from_config(self, *, config, **kwargs) -> None:
            # context parallelism: torchtitan 0.3.0's trainer shards the dataset's `positions` with the tokens
            # (distributed/context_parallel prepare_context_parallel_input), and forward embeds those positions
            attention = self.layers[0].attention
            _check_runtime(
                config,
                heads=attention.n_heads,
                kv_heads=attention.n_kv_heads,
                max_seq=self.max_seq_len,
            )
            set_gpt_sharding_config(self, enable_sp=config.parallelism.enable_sequence_parallel)

        def get_nparams_and_flops(self, model, seq_len):
            attention = self.layers[0].attention
            return get_dense_model_nparams_and_flops(
                model,
                n_layers=len(self.layers),
                n_heads=attention.n_heads,
                head_dims=2 * attention.head_dim,
                seq_len=seq_len,
                enable_weight_tying=self.enable_weight_tying,
            )

    def __init__(self, config: Config):
        super().__init__(config)
        self.pos_embeddings = config.pos_embeddings.build()

    def forward(self, tokens, positions=None, attention_masks=None):
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if positions is None:
                positions = (
                    torch.arange(tokens.shape[1], device=tokens.device)
                    .unsqueeze(0)
                    .expand(tokens.shape[0], -1)
                )
            h = h + self.pos_embeddings(positions)
        for layer in self.layers.values():
            h = layer(h, attention_masks, positions)
        h = self.norm(h) if self.norm is not None else h
        if self._skip_lm_head:
            return h
        return self.lm_head(h) if self.lm_head is not None else h

    def init_states(self, *, buffer_device=None) -> None:
        init_tied_states(self, buffer_device=buffer_device)


def gpt_config(
    *,
    vocab: int,
    dim: int,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    hidden_dim: int,
    n_positions: int,
    tied: bool,
    attn_backend: str = "flex",
) -> GPTModel.Config:
    """The GPT model config (GPT-2 initialization: normal(0, 0.02), residual projections scaled by depth)."""
    linear = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}
    norm = {"weight": nn.init.ones_, "bias": nn.init.zeros_}

    def residual(layer_id):
        return {
            "weight": partial(nn.init.normal_, std=depth_scaled_std(0.02, layer_id)),
            "bias": nn.init.zeros_,
        }

    layers = []
    for layer_id in range(n_layers):
        layers.append(
            GPTBlock.Config(
                attention_norm=LayerNorm.Config(normalized_shape=dim, param_init=norm),
                ffn_norm=LayerNorm.Config(normalized_shape=dim, param_init=norm),
                attention=GPTAttention.Config(
                    n_heads=n_heads,
                    n_kv_heads=n_heads,
                    dim=dim,
                    head_dim=head_dim,
                    qkv_linear=FusedQKVLinear.Config(
                        head_dim=head_dim,
                        n_heads=n_heads,
                        n_kv_heads=n_heads,
                        wqkv=Linear.Config(
                            in_features=dim,
                            out_features=3 * n_heads * head_dim,
                            bias=True,
                            param_init=linear,
                        ),
                    ),
                    wo=Linear.Config(
                        in_features=n_heads * head_dim,
                        out_features=dim,
                        bias=True,
                        param_init=residual(layer_id),
                    ),
                    inner_attention=get_attention_config(attn_backend),
                ),
                feed_forward=GeluFeedForward.Config(
                    w1=Linear.Config(
                        in_features=dim, out_features=hidden_dim, bias=True, param_init=linear
                    ),
                    w2=Linear.Config(
                        in_features=hidden_dim,
                        out_features=dim,
                        bias=True,
                        param_init=residual(layer_id),
                    ),
                ),
            )
        )
    return GPTModel.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            param_init={"weight": partial(nn.init.normal_, std=0.02)},
        ),
        pos_embeddings=PositionEmbedding.Config(
            num_embeddings=n_positions,
            embedding_dim=dim,
            param_init={"weight": partial(nn.init.normal_, std=0.01)},
        ),
        norm=LayerNorm.Config(normalized_shape=dim, param_init=norm),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=linear),
        layers=layers,
    )


# --- tied input/output embeddings across pipeline stages ------------------------------------------
# torchtitan's Decoder refuses weight tying with pipeline parallelism. Megatron-LM's answer
# (Narayanan et al. 2021; megatron/core/distributed/finalize_model_grads.py): the first and the last
# stage each hold the table, start from the same values and add their gradients before the
# optimizer step. Here: a process group per (first-stage rank, last-stage rank) pair, a broadcast of
# the last stage's initial table (lm_head's initialization, as torchtitan ties it), and an all-reduce of the two gradients in an optimizer pre-step hook
# (after torchtitan's gradient clipping, which therefore sees the two partial gradients).


def init_tied_states(model, *, buffer_device=None) -> None:
    """Initialize a model part; its tied table is taken from the last stage when the stages differ."""
    if model.enable_weight_tying and model.tok_embeddings is not None and model.lm_head is not None:
        model.tok_embeddings.weight = model.lm_head.weight
    Module.init_states(model, buffer_device=buffer_device)
    pair = getattr(model, "_planner_tied_pair", None)
    if pair is not None:
        group, src, table = pair
        dist.broadcast(_local(table(model)), src=src, group=group)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _tied_table(model):
    return model.tok_embeddings.weight if model.tok_embeddings is not None else model.lm_head.weight


def pipeline_tied(model, *, parallel_dims, parallelism, **kwargs):
    """torchtitan's pipeline_llm, with the tied table synchronized between the first and last stages."""
    tied = getattr(model, "enable_weight_tying", False)
    result = pipeline_llm(model, parallel_dims=parallel_dims, parallelism=parallelism, **kwargs)
    if not tied:
        return result
    schedule, parts, _, _ = result
    pp_ranks = parallel_dims.get_mesh("pp").mesh.flatten().tolist()
    stride = pp_ranks[1] - pp_ranks[0]
    width = dist.get_world_size() // parallel_dims.pp
    if pp_ranks != [pp_ranks[0] + k * stride for k in range(parallel_dims.pp)] or stride != width:
        raise NotImplementedError(
            "tied embeddings across stages need pp as the outermost mesh dimension"
        )
    pairs = [[i, i + (parallel_dims.pp - 1) * width] for i in range(width)]
    group, _ = dist.new_subgroups_by_enumeration(pairs)
    first, last = pp_ranks[0], pp_ranks[-1]
    for part in parts:
        if (part.tok_embeddings is None) != (part.lm_head is None):  # holds one copy of the table
            if dist.get_rank() != (first if part.tok_embeddings is not None else last):
                raise NotImplementedError(
                    "the first and last pipeline stages must sit on the first and last pp ranks "
                    "(looped schedules)"
                )
            part._planner_tied_pair = (
                group,
                last,
                _tied_table,
            )  # the last stage's initial values win
    return result


def parallelize_tied(model, **kwargs):
    """torchtitan's llama3 parallelize on a model part; a part with one copy of a tied table is sharded
    like an untied one (torchtitan's FSDP wrapping groups tied modules only when both are present)."""
    model.enable_weight_tying = (
        model.enable_weight_tying and model.tok_embeddings is not None and model.lm_head is not None
    )
    return parallelize_llama(model, **kwargs)


def sync_tied_grads_hook(optimizers, model_parts, parallel_dims) -> None:
    """Add the first and last stages' gradients of the tied table before each optimizer step."""
    pairs = [
        (part._planner_tied_pair, part)
        for part in model_parts
        if hasattr(part, "_planner_tied_pair")
    ]
    if not pairs:
        return

    def hook(*args, **kwargs):
        for (group, _, table), part in pairs:
            grad = table(part).grad
            if grad is not None:
                dist.all_reduce(_local(grad), group=group)

    optimizers.register_step_pre_hook(hook)


def tied_model_spec(name: str, flavor: str, config) -> ModelSpec:
    """A model spec whose parallelize/pipeline functions are torchtitan's llama3 ones plus the tied table."""
    return ModelSpec(
        name=name,
        flavor=flavor,
        model=config,
        parallelize_fn=parallelize_tied,
        pipelining_fn=pipeline_tied,
        post_optimizer_build_fn=sync_tied_grads_hook,
        state_dict_adapter=None,
    )


# --- end of the planner's models ---------------------------------------------------------------------
