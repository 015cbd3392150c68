"""CAN THE TARGET RUN THIS PLAN: every refusal rule of the exporters, one function per target.

Each `*_limits(plan)` returns the reasons the target cannot run the plan as it stands (empty when
it can); the exporter refuses with them (exit 2) and never writes a config that fails at launch,
runs out of memory the plan did not count, or silently trains something else. Differences that
leave the model, the batch and the degrees alone and need no more memory are notes, written by the
exporters themselves.

What a *framework* can run (schedules, ZeRO with pipelining, precisions, offload, ...) is not
repeated here: frameworks.rules.violations checks it against frameworks/*.json before any exporter runs
(planner.exports.retarget). These rules are what the *exported file* of a release can express: the
model shapes the target builds, settings its configuration has. Versions: docs/exports.md.
"""

from __future__ import annotations

from frameworks import load_framework
from frameworks.rules import a2a_overlap_conflict, mtp_without_pp_or_cp
from planner.exports.common import chunk_blocks, model_moe, model_spec
from planner.hf_config import GEMMA_ACTIVATIONS
from planner.partition import even_split
from planner.plan import Plan
from planner.spec import TransformerSpec

HF_DECODER_LAYER = {
    # planner model_type: (transformers config class, causal-LM class, decoder layer class FSDP wraps)
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "GPT2Block"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaDecoderLayer"),
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralDecoderLayer"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2DecoderLayer"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "MixtralDecoderLayer"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "Qwen3MoeDecoderLayer"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3DecoderLayer"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "Phi3DecoderLayer"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "GemmaDecoderLayer"),
}
"""Model families whose Hugging Face config the fsdp exporter writes (planner.exports.fsdp; transformers
5.23.0 class names): the families fsdp_limits accepts."""


def target_limits(fmt: str, plan: Plan) -> list[str]:
    """Refusal reasons of `fmt` for `plan` (empty: the target can run it)."""
    return LIMITS[fmt](plan)


# ------------------------------------------------------------------------------------- torchtitan 0.3.0


def torchtitan_limits(plan: Plan) -> list[str]:
    """torchtitan 0.3.0 (the exporter builds its llama3 model, the job's own GPT model, or one of
    torchtitan's MoE families: TORCHTITAN_MOE_FAMILIES)."""
    cfg, spec, out = plan.config, model_spec(plan), []
    moe = model_moe(plan)
    if spec is None:
        return [_NO_ARCH]
    if cfg.tp > 1 and (spec.heads % cfg.tp or spec.n_kv_heads % cfg.tp):
        out.append(
            f"tp={cfg.tp} does not divide the {spec.heads} heads and {spec.n_kv_heads} key/value heads: "
            "torchtitan's Decoder shards whole heads (models/common/decoder.py Decoder.Config.update_from_config)"
        )
    if moe is not None:
        return out + _torchtitan_moe(spec, cfg)
    if cfg.ep > 1 or cfg.expert_tp > 1:
        return [f"ep={cfg.ep}, expert_tp={cfg.expert_tp} on {spec.name}, a model without experts"]
    if spec.position == "learned":
        out += _gpt_only(spec)
    elif spec.model_type in TORCHTITAN_DENSE_FAMILIES:
        out += _qwen3_dense_only(spec)
    else:
        out += _llama_only(
            spec, "torchtitan 0.3.0's llama3 model (the one decoder the exporter builds)"
        )
    return out


TORCHTITAN_DENSE_FAMILIES = {
    # planner model_type: as TORCHTITAN_MOE_FAMILIES, for dense models other than llama3
    "qwen3": ("qwen3", "Qwen3Model", "_build_qwen3_layers", "qwen3_14b"),
}
"""Dense model families torchtitan 0.3.0 ships beside llama3 (torchtitan/models/qwen3 builds dense Qwen3 too)."""


def _qwen3_dense_only(spec: TransformerSpec) -> list[str]:
    """A dense Qwen3 torchtitan's Qwen3Model builds (_build_qwen3_layers): RoPE, RMSNorm, SwiGLU, QK-norm, no
    biases, any head_dim, no window."""
    wrong = []
    if spec.position != "rope" or spec.norm != "rmsnorm" or not spec.swiglu:
        wrong.append(f"position={spec.position}, norm={spec.norm}, MLP {spec.activation}")
    if spec.qkv_bias or spec.out_bias or spec.mlp_bias:
        wrong.append("linear biases")
    if not spec.qk_norm:
        wrong.append("no QK-norm")
    if (
        spec.parallel_block
        or spec.embed_norm
        or not spec.final_norm
        or spec.sliding_window
        or spec.mla is not None
        or spec.attention_sinks
        or spec.mtp_modules
    ):
        wrong.append(
            "parallel block / embedding norm / no final norm / sliding window / MLA / sinks / MTP"
        )
    if not wrong:
        return []
    return [
        f"{spec.name} ({spec.model_type}: {', '.join(wrong)}) is not a model torchtitan 0.3.0's Qwen3Model "
        "expresses (torchtitan/models/qwen3, _build_qwen3_layers)"
    ]


TORCHTITAN_MOE_FAMILIES = {
    # planner model_type: (torchtitan 0.3.0's package under torchtitan/models, its model class, the layer builder
    # the export follows, the config_registry.py job the export starts from)
    "deepseek_v3": ("deepseek_v3", "DeepSeekV3Model", "build_mla_moe_layers", "deepseek_v3_671b"),
    "qwen3_moe": ("qwen3", "Qwen3Model", "_build_qwen3_moe_layers", "qwen3_30b_a3b"),
    "gpt_oss": ("gpt_oss", "GptOssModel", "_build_gptoss_layers", "gpt_oss_120b"),
}
"""The mixture-of-experts families torchtitan 0.3.0 ships (frameworks/torchtitan.json moe_model_types)."""


def _torchtitan_moe(spec: TransformerSpec, cfg) -> list[str]:
    """A mixture-of-experts plan on torchtitan 0.3.0: one of its MoE families of the plan's shape, and
    expert degrees its meshes build (torchtitan/distributed/parallel_dims.py, ParallelDims.build_mesh:
    the sparse mesh pp x dp_replicate x efsdp x ep over the dense region dp_shard x cp x tp; the
    exporter widens dp_shard where ep needs it: planner.exports.torchtitan.torchtitan_dp_shard)."""
    moe, family = spec.moe, spec.model_type
    if family not in TORCHTITAN_MOE_FAMILIES:
        return [
            f"mixture-of-experts {spec.name} (model_type {family}): torchtitan 0.3.0 builds the MoE families "
            "deepseek_v3, qwen3_moe (torchtitan/models/qwen3) and gpt_oss only"
        ]
    package, model, builder, _ = TORCHTITAN_MOE_FAMILIES[family]
    package = f"torchtitan/models/{package}"
    wrong = _moe_family_mismatch(spec)
    out = (
        [
            f"{spec.name} ({family}: {', '.join(wrong)}) is not a model torchtitan 0.3.0's {model} expresses "
            f"({package}, {builder})"
        ]
        if wrong
        else []
    )
    if moe.capacity_factor is not None:
        out.append(
            f"capacity_factor={moe.capacity_factor}: torchtitan 0.3.0's MoE is dropless (every token reaches "
            "its top-k experts; models/common/moe.py MoE)"
        )
    if (cfg.pp > 1 or cfg.cp > 1) and mtp_without_pp_or_cp(load_framework("torchtitan"), spec):
        out.append(
            f"multi-token prediction (mtp_modules={spec.mtp_modules}) with pp={cfg.pp}, cp={cfg.cp}: torchtitan "
            "0.3.0's MTPDecoder refuses pipeline and context parallelism (models/deepseek_v3/mtp.py)"
        )
    if spec.tied_embeddings and cfg.pp > 1:
        out.append(
            f"tied embeddings with pp={cfg.pp}: torchtitan's Decoder refuses weight tying with pipeline "
            "parallelism (the job's shared-table workaround covers llama3 and GPT models only)"
        )
    # expert_tp > 1 is the framework's rule (frameworks/torchtitan.json expert_tp false: 0.3.0 has no expert
    # tensor-parallel degree), checked before any exporter runs
    if cfg.ep == 1 and cfg.tp > 1 and moe.expert_ffn % cfg.tp:
        out.append(
            f"tp={cfg.tp} does not divide expert_ffn={moe.expert_ffn}: without expert parallelism torchtitan "
            "0.3.0 shards every expert's width over the tensor-parallel ranks"
        )
    if moe.experts % cfg.ep:
        out.append(f"ep={cfg.ep} does not divide the {moe.experts} routed experts")
    return out


def _moe_family_mismatch(spec: TransformerSpec) -> list[str]:
    """What of the model the torchtitan MoE family of its model_type does not build (the router's scoring,
    normalization, scaling, groups and bias are settings of every family's TokenChoiceTopKRouter)."""
    moe, family, wrong = spec.moe, spec.model_type, []
    if spec.encoder_layers or not spec.causal:
        wrong.append("not a causal decoder")
    if spec.position != "rope" or spec.norm != "rmsnorm" or not spec.gated_mlp:
        wrong.append(f"position={spec.position}, norm={spec.norm}, gated MLP {spec.gated_mlp}")
    if spec.parallel_block or spec.embed_norm or not spec.final_norm or spec.norms_per_block != 2:
        wrong.append("parallel block / embedding norm / no final norm")
    if moe.shared_expert_gate:
        wrong.append("a shared-expert gate")
    if moe.groups_per_token and moe.experts // moe.expert_groups < 2:
        wrong.append("expert groups of fewer than 2 experts (TokenChoiceTopKRouter needs >= 2)")
    if family == "gpt_oss":
        if not (spec.qkv_bias and spec.out_bias and spec.mlp_bias and spec.attention_sinks):
            wrong.append("no linear biases or no attention sinks (gpt-oss has both)")
        if spec.mla is not None or spec.qk_norm or moe.shared_experts or moe.first_dense_layers:
            wrong.append("MLA / QK-norm / shared experts / dense blocks")
    else:
        if spec.qkv_bias or spec.out_bias or spec.mlp_bias:
            wrong.append("linear biases")
        if spec.activation != "silu":
            wrong.append(f"MLP activation {spec.activation}")
        if spec.attention_sinks or spec.sliding_window:
            wrong.append("attention sinks / sliding window")
    if family == "deepseek_v3" and (spec.mla is None or spec.qk_norm):
        wrong.append("no multi-head latent attention" if spec.mla is None else "QK-norm")
    if family == "qwen3_moe":
        if spec.mla is not None or not spec.qk_norm:
            wrong.append("MLA or no QK-norm (Qwen3 attention is GQA with QK-norm)")
        if moe.first_dense_layers:
            wrong.append(
                f"{moe.first_dense_layers} dense leading blocks (every Qwen3 MoE block has experts)"
            )
    if family != "deepseek_v3" and spec.mtp_modules:
        wrong.append("multi-token prediction (torchtitan's MTP layers are DeepSeek-V3's)")
    return wrong


def _block_extras(spec: TransformerSpec) -> list[str]:
    """Block features neither decoder the torchtitan job builds (its GPT, torchtitan's llama3) has."""
    wrong = []
    if spec.parallel_block or spec.embed_norm or not spec.final_norm or spec.sliding_window:
        wrong.append("parallel block / embedding norm / no final norm / sliding window")
    if spec.mla is not None or spec.qk_norm or spec.attention_sinks or spec.mtp_modules:
        wrong.append("MLA / QK-norm / attention sinks / MTP")
    return wrong


def _gpt_only(spec: TransformerSpec) -> list[str]:
    """A decoder the job's own GPT model (planner.exports.torchtitan_models) builds: learned positions,
    pre-LayerNorm, GELU MLP, biases on every linear, multi-head attention."""
    wrong = []
    if spec.encoder_layers or not spec.causal:
        wrong.append("not a causal decoder")
    if spec.norm != "layernorm" or spec.gated_mlp or spec.activation != "gelu":
        wrong.append(f"norm={spec.norm}, MLP {'gated ' if spec.gated_mlp else ''}{spec.activation}")
    if not (spec.qkv_bias and spec.out_bias and spec.mlp_bias):
        wrong.append("linears without biases")
    if spec.n_kv_heads != spec.heads:
        wrong.append("grouped-query attention")
    wrong += _block_extras(spec)
    if not wrong:
        return []
    return [
        f"{spec.name} ({spec.model_type}: {', '.join(wrong)}) is not a GPT-style model the exported job's GPT "
        "decoder builds (learned positions, LayerNorm, GELU, biases)"
    ]


# ---------------------------------------------------------------------------------- Megatron-LM (core 0.19)


def megatron_limits(plan: Plan) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` (megatron/training/arguments.py of megatron-core 0.19.2)."""
    cfg, spec, out = plan.config, model_spec(plan), []
    if spec is None:
        return [_NO_ARCH]
    if spec.encoder_layers or not spec.causal:
        out.append(
            f"{spec.model_type} is not a decoder-only causal model; pretrain_gpt.py builds GPT-style decoders"
        )
    if spec.position in ("alibi", "relative"):
        out.append(
            f"position={spec.position}: Megatron-LM's GPT model has learned, rotary or no positions"
        )
    if spec.parallel_block or spec.norms_per_block != 2:
        out.append("parallel attention/MLP blocks: Megatron-LM's GPT block is sequential")
    if spec.embed_norm or not spec.final_norm or spec.type_vocab or spec.pooler or spec.mlm_head:
        out.append("embedding norm / no final norm / BERT heads: not in Megatron-LM's GPT model")
    if spec.gated_mlp and spec.activation != "silu":
        out.append(
            f"gated MLP with {spec.activation}: Megatron-LM's arguments have SwiGLU (--swiglu) only"
        )
    if not spec.gated_mlp and spec.activation != "gelu":
        out.append(f"MLP activation {spec.activation}: Megatron-LM's arguments have GELU or SwiGLU")
    out += _megatron_unwritten(spec)
    software = plan.document.get("software") or {}
    if spec.moe is not None and software.get("moe_a2a_overlap") and cfg.ep > 1:
        why = a2a_overlap_conflict(
            pp=cfg.pp,
            virtual_stages=cfg.virtual_stages,
            recompute=cfg.recompute,
            precision=cfg.precision,
            recompute_modules=software.get("recompute_modules") or (),
            mtp_modules=spec.mtp_modules,
        )
        if why:
            out.append(
                f"moe_a2a_overlap: Megatron-Core's --overlap-moe-expert-parallel-comm {why} "
                "(TransformerConfig.overlap_moe_expert_parallel_comm)"
            )
    if spec.moe is not None and software.get("moe_fp8_dispatch"):
        out.append(
            "moe_fp8_dispatch: Megatron-LM has no argument for dispatching tokens in FP8; its dispatchers send "
            "them in the compute dtype, twice the bytes the plan costed"
        )
    if _bias_pattern(spec) is None:
        out.append(
            "bias pattern (qkv, out, mlp) = "
            f"({spec.qkv_bias}, {spec.out_bias}, {spec.mlp_bias}): Megatron-LM has all biases, none, or qkv only"
        )
    return out


# ----------------------------------------------------------------- fsdp (Accelerate 1.15 / transformers 5.23)


def fsdp_limits(plan: Plan) -> list[str]:
    """Hugging Face modules under DDP / FSDP2 through Accelerate (planner.exports.fsdp)."""
    cfg, spec, out = plan.config, model_spec(plan), []
    if spec is None:
        return [_NO_ARCH]
    if spec.model_type not in HF_DECODER_LAYER:
        return [
            f"{spec.name} ({spec.model_type}): the exporter writes Hugging Face configs for "
            + ", ".join(sorted(HF_DECODER_LAYER))
            + " models"
        ]
    if spec.model_type == "gpt2":
        if not (
            spec.position == "learned"
            and spec.norm == "layernorm"
            and not spec.gated_mlp
            and spec.qkv_bias
            and spec.out_bias
            and spec.mlp_bias
            and spec.d_head * spec.heads == spec.hidden
        ):
            out.append(
                f"{spec.name}: not the shape of transformers' GPT2 model (learned positions, LayerNorm, GELU MLP, "
                "biases, head_dim = hidden/heads)"
            )
    elif spec.model_type == "gemma":
        if not (
            spec.position == "rope"
            and spec.norm == "rmsnorm"
            and spec.gated_mlp
            and spec.activation in GEMMA_ACTIVATIONS
            and not spec.out_bias
            and not spec.parallel_block
        ):
            out.append(
                f"{spec.name}: not the shape of transformers' gemma model (RoPE, RMSNorm, GeGLU)"
            )
    elif not (
        spec.position == "rope"
        and spec.norm == "rmsnorm"
        and spec.swiglu
        and not spec.out_bias
        and not spec.parallel_block
    ):
        out.append(
            f"{spec.name}: not the shape of transformers' {spec.model_type} model (RoPE, RMSNorm, SwiGLU)"
        )
    want_qk_norm = spec.model_type in ("qwen3_moe", "qwen3")
    if (
        spec.mla is not None
        or spec.attention_sinks
        or spec.mtp_modules
        or spec.qk_norm != want_qk_norm
        or (spec.sliding_window and spec.model_type not in ("mistral", "phi3"))
        or spec.window_layers is not None
        or (spec.model_type == "phi3" and spec.qkv_bias)
    ):
        out.append(
            f"{spec.name}: MLA / attention sinks / MTP / QK-norm / sliding windows that transformers' "
            f"{spec.model_type} model does not have"
        )
    if cfg.offloads("optimizer") and (cfg.zero == 0 or cfg.dp == 1):
        out.append(
            "offload=optimizer without sharding: DistributedDataParallel has no optimizer offload "
            "(FSDP's CPU offload needs ZeRO-2/3)"
        )
    return out


# --------------------------------------------------------------------------------------- DeepSpeed 0.19


def deepspeed_limits(plan: Plan) -> list[str]:
    """DeepSpeed 0.19.8 config JSON (deepspeed.runtime.config.DeepSpeedConfig) with its engines."""
    cfg, out = plan.config, []
    stages = list(chunk_blocks(plan))
    even = list(even_split(sum(stages), len(stages))) if stages else []
    if cfg.pp > 1 and stages != even:
        out.append(
            f"blocks per stage {stages}: DeepSpeed 0.19.8's PipelineModule has no explicit "
            f"split; its partition_method 'type:<block class>' gives {even} (re-estimate "
            "with those stages)"
        )
    if cfg.offloads("optimizer") and cfg.zero == 0:
        out.append(
            "DeepSpeed offloads the optimizer only with ZeRO >= 1; the plan has offload=optimizer with ZeRO-0"
        )
    if cfg.offloads("activations") and cfg.recompute == "none":
        out.append(
            "offload=activations: DeepSpeed offloads checkpointed activations only (cpu_checkpointing), "
            "and the plan has recompute=none"
        )
    moe = model_moe(plan)
    if moe is not None:
        gate = [
            what
            for what, has in (
                ("sigmoid scoring", moe.router != "softmax"),
                ("the expert-bias balancing", moe.aux_free_bias),
                ("group-limited routing", bool(moe.groups_per_token)),
                ("a routed scaling factor", moe.routed_scaling != 1.0),
                ("a learned router bias", moe.router_bias),
                ("a shared-expert gate", moe.shared_expert_gate),
                ("more than one shared expert", moe.shared_experts > 1),
            )
            if has
        ]
        if gate:
            out.append(
                f"mixture-of-experts with {', '.join(gate)}: DeepSpeed-MoE's layer (deepspeed.moe.layer.MoE) has a "
                "softmax top-k gate and at most one residual (shared) expert"
            )
    return out


# ----------------------------------------------------------------------- SageMaker SMP v2 (SDK v3)


def sagemaker_limits(plan: Plan) -> list[str]:
    """SageMaker model parallelism v2 through SageMaker Python SDK v3 (sagemaker.train.distributed)."""
    cfg, out = plan.config, []
    if cfg.pp > 1:
        out.append(
            f"pipeline parallelism (pp={cfg.pp}): SageMaker model parallelism v2 has none; "
            "--format sagemaker-v1 (SMP v1) can express it"
        )
    if cfg.expert_tp > 1:
        out.append(f"expert_tp={cfg.expert_tp}: SMP v2 has no expert tensor-parallel degree")
    if cfg.offloads("activations") and cfg.recompute == "none":
        out.append(
            "offload=activations: SMP v2 offloads checkpointed activations only, and the plan has recompute=none"
        )
    return out


# ----------------------------------------------------------------------- SageMaker SMP v1 (SDK v2)


def sagemaker_v1_limits(plan: Plan) -> list[str]:
    """SageMaker model parallelism v1 through SageMaker Python SDK v2 (PyTorch estimator `distribution`)."""
    cfg, out = plan.config, []
    if cfg.cp > 1:
        out.append(f"cp={cfg.cp}: SageMaker model parallelism v1 has no context parallelism")
    if cfg.ep > 1 or model_moe(plan):
        out.append("mixture-of-experts: SageMaker model parallelism v1 has no expert parallelism")
    if cfg.zero == 2:
        out.append(
            "ZeRO-2: SMP v1 shards optimizer states (shard_optimizer_state) or everything "
            "(sharded_data_parallel_degree), not gradients alone; ZeRO-1 would need more memory than planned"
        )
    if cfg.zero == 3 and cfg.pp > 1:
        out.append(
            f"ZeRO-3 with pp={cfg.pp}: SMP v1's sharded data parallelism does not combine with pipeline parallelism"
        )
    if cfg.offloads("optimizer"):
        out.append(
            "offload=optimizer: SMP v1 has no optimizer offload, and the plan's memory counts on it"
        )
    if cfg.offloads("activations") and cfg.recompute == "none":
        out.append(
            "offload=activations: SMP v1 offloads checkpointed activations only, and the plan has recompute=none"
        )
    if cfg.precision == "fp8":
        out.append("precision fp8: SMP v1 has no FP8 training")
    return out


LIMITS = {
    "torchtitan": torchtitan_limits,
    "megatron": megatron_limits,
    "fsdp": fsdp_limits,
    "deepspeed": deepspeed_limits,
    "sagemaker": sagemaker_limits,
    "sagemaker-v1": sagemaker_v1_limits,
}

_NO_ARCH = (
    "the plan document has no model.arch (the model's full shape), which this target needs to build the "
    "model; re-run `planner estimate --json` or `planner recommend --out`"
)


def _llama_only(spec: TransformerSpec, what: str) -> list[str]:
    """A decoder the llama3 model of torchtitan can build: RoPE, RMSNorm, SwiGLU, no biases."""
    wrong = []
    if spec.encoder_layers or not spec.causal:
        wrong.append("not a causal decoder")
    if spec.position != "rope":
        wrong.append(f"position={spec.position}")
    if spec.norm != "rmsnorm":
        wrong.append(f"norm={spec.norm}")
    if not spec.swiglu:
        wrong.append("MLP is not SwiGLU")
    if spec.qkv_bias or spec.out_bias or spec.mlp_bias:
        wrong.append("linear biases")
    if spec.d_head * spec.heads != spec.hidden:
        wrong.append(f"head_dim {spec.d_head} != hidden/heads")
    wrong += _block_extras(spec)
    if not wrong:
        return []
    return [
        f"{spec.name} ({spec.model_type}: {', '.join(wrong)}) is not a model {what} can express"
    ]


def _unwritten_model_features(spec: TransformerSpec, target: str) -> list[str]:
    """Model features of planner.spec the exporter does not write yet (a refusal, so that the export
    never builds a different model): MLA, QK-norm, attention sinks, a window on some blocks only,
    MTP modules, and routers other than Mixtral's softmax top-k (dropless, no bias, no groups)."""
    moe, features = spec.moe, []
    if spec.mla is not None:
        features.append("multi-head latent attention")
    if spec.qk_norm:
        features.append("QK-norm")
    if spec.attention_sinks:
        features.append("attention sinks")
    if spec.sliding_window and spec.window_layers is not None:
        features.append("a sliding window on some blocks only")
    if spec.mtp_modules:
        features.append("multi-token prediction")
    if moe is not None and (
        moe.router != "softmax"
        or moe.router_bias
        or moe.aux_free_bias
        or moe.groups_per_token
        or moe.shared_expert_gate
        or moe.capacity_factor is not None
        or moe.routed_scaling != 1.0
        or not moe.normalize_top_k
    ):
        features.append("its router (scoring, bias, groups, gate, scaling or capacity)")
    if not features:
        return []
    return [
        f"{spec.name}: the exporter does not write {target} arguments for {', '.join(features)} yet"
    ]


def _megatron_unwritten(spec: TransformerSpec) -> list[str]:
    """Model features Megatron-LM's arguments cannot state: attention sinks, a window on some blocks
    only, a learned router bias, and a sigmoid router without top-k renormalization (Megatron's
    sigmoid router always renormalizes)."""
    moe, features = spec.moe, []
    if spec.attention_sinks:
        features.append("attention sinks")
    if spec.sliding_window and spec.window_layers is not None:
        features.append("a sliding window on some blocks only")
    if moe is not None and moe.router_bias:
        features.append("a learned router bias")
    if moe is not None and moe.router == "sigmoid" and not moe.normalize_top_k:
        features.append("a sigmoid router without top-k renormalization")
    if moe is not None and moe.groups_per_token and moe.expert_groups == 1:
        features.append("group-limited routing without groups")
    if not features:
        return []
    return [f"{spec.name}: Megatron-LM's arguments have no {', '.join(features)}"]


def _bias_pattern(spec: TransformerSpec) -> str | None:
    """Megatron-LM's bias options: 'all' (default), 'none' (--disable-bias-linear) or 'qkv'
    (--disable-bias-linear --add-qkv-bias); None when the model's pattern is none of them."""
    flags = (spec.qkv_bias, spec.out_bias, spec.mlp_bias)
    return {
        (True, True, True): "all",
        (False, False, False): "none",
        (True, False, False): "qkv",
    }.get(flags)
