"""Plain PyTorch data parallelism over Hugging Face modules: an Accelerate FSDP configuration plus the
matching `transformers.TrainingArguments` (Accelerate 1.15.0, transformers 5.23.0).

The file is one YAML document that `accelerate launch --config_file FILE train.py` reads
(accelerate/commands/config/config_args.py `ClusterConfig`; the launcher turns `fsdp_config` and
`parallelism_config` into the FSDP_* / PARALLELISM_CONFIG_* environment that
`FullyShardedDataParallelPlugin` and `ParallelismConfig` read in the training process), followed by
a commented Python block: the `TrainingArguments(...)` of the script's Trainer and the Hugging Face
model config of the plan's shape (for training from scratch; `from_pretrained` gives the same model).
Accelerate's loader reads one YAML document and refuses unknown keys, so the Trainer part lives in
comments (the validator reads it with Python's parser).

Mapping (Accelerate's FSDP2 names, accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin):
ZeRO-0 is DistributedDataParallel (`distributed_type: MULTI_GPU`); ZeRO-2 is FSDP2 with
`fsdp_reshard_after_forward: false` (SHARD_GRAD_OP); ZeRO-3 `true` (FULL_SHARD); dp_shard < dp adds
`parallelism_config` dp_replicate_size x dp_shard_size (HYBRID_SHARD); offload=optimizer is
`fsdp_offload_params` (CPUOffloadPolicy: parameters, gradients and optimizer step on the host);
recompute=full is `fsdp_activation_checkpointing` on the wrapped decoder layers (FSDP) or
`gradient_checkpointing` (DDP); checkpoint_interval_s becomes `save_steps`.
"""

from __future__ import annotations

from planner.exports.common import (
    Export,
    cannot,
    devices_per_node,
    header,
    require_spec,
    steps_between_checkpoints,
)
from planner.exports.limits import HF_DECODER_LAYER, fsdp_limits
from planner.plan import Plan, run_options

PRECISION = {"fp32": "no", "amp-fp16": "fp16", "amp-bf16": "bf16", "bf16": "bf16", "fp8": "fp8"}
"""Planner precision -> Accelerate mixed_precision (every precision of frameworks/fsdp.json)."""

FP8_CONFIG = {"backend": "TE", "fp8_format": "HYBRID"}
"""Accelerate's fp8_config for precision fp8: Transformer Engine's linear layers under fp8_autocast
with the
HYBRID recipe (E4M3 forward, E5M2 gradients), the FP8 the fsdp profile is costed with
(frameworks/fsdp.json
sources.fp8_cast_bytes_per_element); the launcher exports it as ACCELERATE_FP8_BACKEND / _FP8_FORMAT
(accelerate/utils/launch.py setup_fp8_env)."""


def hf_config(spec, seq: int) -> tuple[str, dict]:
    """(transformers config class, keyword arguments) that build the plan's model shape."""
    cls = HF_DECODER_LAYER[spec.model_type][0]
    if spec.model_type == "gpt2":
        return cls, {
            "vocab_size": spec.vocab,
            "n_positions": max(seq, spec.n_positions),
            "n_embd": spec.hidden,
            "n_layer": spec.layers,
            "n_head": spec.heads,
            "n_inner": spec.d_ffn,
            "activation_function": "gelu_new",
            "tie_word_embeddings": spec.tied_embeddings,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
    kwargs = {
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.n_kv_heads,
        "intermediate_size": spec.d_ffn,
        "max_position_embeddings": max(seq, spec.seq),
        "rope_theta": float(spec.rope_theta),
        "tie_word_embeddings": spec.tied_embeddings,
        "attention_bias": spec.qkv_bias,
    }
    if spec.d_head * spec.heads != spec.hidden:
        kwargs["head_dim"] = spec.d_head
    if spec.model_type == "llama":
        kwargs["mlp_bias"] = spec.mlp_bias
    if spec.model_type in ("qwen2", "mistral"):
        kwargs.pop("attention_bias")
    if spec.sliding_window and spec.model_type in ("mistral", "phi3"):
        kwargs["sliding_window"] = spec.sliding_window
    if spec.model_type in (
        "qwen3",
        "gemma",
    ):  # their config classes default head_dim to 128 / 256, not hidden/heads
        kwargs["head_dim"] = spec.d_head
    if spec.model_type == "qwen3":
        kwargs["use_sliding_window"] = False
    if spec.model_type == "gemma":
        kwargs["hidden_activation"] = spec.activation
    if spec.model_type == "phi3":
        kwargs.pop("attention_bias")  # Phi-3 has no biases and no such key
        kwargs["sliding_window"] = spec.sliding_window or None
        if spec.vocab <= 32000:  # Phi3Config's pad_token_id 32000 must index the embedding
            kwargs["pad_token_id"] = None
    if spec.moe is not None:
        moe = spec.moe
        if spec.model_type == "mixtral":
            kwargs.update(
                num_local_experts=moe.experts,
                num_experts_per_tok=moe.top_k,
                intermediate_size=moe.expert_ffn,
            )
        else:
            kwargs.update(
                num_experts=moe.experts,
                num_experts_per_tok=moe.top_k,
                moe_intermediate_size=moe.expert_ffn,
                norm_topk_prob=moe.normalize_top_k,
                head_dim=spec.d_head,
            )
            kwargs.pop("attention_bias")
    return cls, kwargs


def to_fsdp(plan: Plan) -> Export:
    """Accelerate FSDP config + TrainingArguments for the plan (refusal when these stacks cannot run it)."""
    refusals = fsdp_limits(plan)
    if refusals:
        raise cannot("fsdp", "; ".join(refusals))
    cfg, spec, notes = plan.config, require_spec(plan, "fsdp"), []
    sharded = cfg.zero >= 1 and cfg.dp > 1
    doc = _launch_config(plan, sharded, notes)
    if sharded:
        doc.update(_fsdp_sections(cfg, spec, notes))
    targs = _training_arguments(plan, sharded, notes)
    if cfg.recompute_layers is not None:
        notes.append(_recompute_layers_note(cfg, spec))
    metrics = run_options(plan.document).train_metrics
    if metrics:
        notes.append(
            f"train_metrics={metrics}: the plan was costed with a trainer computing {metrics} "
            "cross-entropy metrics over each micro-batch's logits (Composer / llm-foundry); the "
            "Hugging Face Trainer run below computes none, so its steps take less than predicted"
        )
    if cfg.precision == "bf16":
        notes.append(
            "precision bf16: load the model in bfloat16 (dtype below) so that weights, gradients and AdamW "
            "states are 16-bit, as planned"
        )
    config_cls, config_kwargs = hf_config(spec, cfg.seq)
    if cfg.precision == "bf16":
        config_kwargs["dtype"] = "bfloat16"
    text = _yaml(plan, doc) + _python_block(plan, targs, config_cls, config_kwargs, spec)
    return Export(format="fsdp", text=text, notes=tuple(notes))


def _launch_config(plan: Plan, sharded: bool, notes: list[str]) -> dict[str, object]:
    """Accelerate's launch settings: distributed type, precision (fp8 through Transformer
    Engine), machines and processes."""
    cfg = plan.config
    doc: dict[str, object] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP" if sharded else "MULTI_GPU",
        "mixed_precision": PRECISION[cfg.precision],
        "num_machines": plan.nodes,
        "num_processes": plan.gpus,
        "machine_rank": 0,
        "main_process_ip": "MAIN_NODE_ADDRESS",
        "main_process_port": 29500,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "use_cpu": False,
    }
    if cfg.precision == "fp8":
        doc["fp8_config"] = dict(FP8_CONFIG)
        notes.append(
            "fp8: Accelerate's Transformer Engine backend (fp8_config) swaps the Linear "
            "layers for te.Linear under fp8_autocast, bf16 elsewhere; needs "
            "transformer_engine on every node and an SM89+ GPU; TrainingArguments leave "
            "bf16/fp16 off so the Trainer takes fp8 from the launcher"
        )
    return doc


def _fsdp_sections(cfg, spec, notes: list[str]) -> dict[str, object]:
    """fsdp_config (FSDP2, ZeRO-2/3, wrapping, offload, checkpointing) and, for dp_shard, the
    hybrid-sharding parallelism_config."""
    if cfg.zero == 1:
        notes.append(
            "ZeRO-1: FSDP has no optimizer-only sharding; exported as SHARD_GRAD_OP (ZeRO-2: less memory)"
        )
    sections: dict[str, object] = {
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": cfg.zero == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": HF_DECODER_LAYER[spec.model_type][2],
            "fsdp_offload_params": cfg.offloads("optimizer"),
            "fsdp_activation_checkpointing": cfg.recompute == "full",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
        }
    }
    if cfg.shard_group < cfg.dp:
        sections["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": cfg.dp // cfg.shard_group,
            "parallelism_config_dp_shard_size": cfg.shard_group,
            "parallelism_config_tp_size": 1,
            "parallelism_config_cp_size": 1,
        }
        notes.append(
            f"dp_shard={cfg.shard_group}: FSDP2 hybrid sharding (HYBRID_SHARD) over a "
            f"{cfg.dp // cfg.shard_group} x {cfg.shard_group} (replicate x shard) mesh from parallelism_config"
        )
    if cfg.offloads("optimizer"):
        notes.append(
            "offload=optimizer: FSDP2 CPUOffloadPolicy keeps parameters, gradients and optimizer states on "
            "the host and steps there (less GPU memory than the plan counts)"
        )
    if cfg.precision.startswith("amp"):
        notes.append(
            "Accelerate's FSDP mixed precision reduces gradients in the 16-bit dtype (the plan costs an fp32 "
            "reduction: less traffic, same memory)"
        )
    return sections


def _training_arguments(plan: Plan, sharded: bool, notes: list[str]) -> dict[str, object]:
    """transformers TrainingArguments: batch, accumulation, precision, recompute, optimizer and
    the checkpoint interval in steps."""
    cfg = plan.config
    steps = steps_between_checkpoints(plan)
    targs: dict[str, object] = {
        "output_dir": "planner-run",
        "per_device_train_batch_size": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.num_microbatches,
        "bf16": cfg.precision in ("amp-bf16", "bf16"),
        "fp16": cfg.precision == "amp-fp16",
        "gradient_checkpointing": cfg.recompute == "full" and not sharded,
        "optim": "adamw_torch" if cfg.optimizer == "adamw" else "sgd",
    }
    if steps:
        targs.update(save_strategy="steps", save_steps=steps)
        notes.append(
            f"save_steps={steps}: the plan's checkpoint interval "
            f"{plan.document['plan']['checkpoint_interval_s']:g} s at the predicted "
            f"{plan.prediction.step_time_s:.3f} s per step"
        )
    if not sharded and cfg.dp > 1:
        targs["ddp_find_unused_parameters"] = False
    return targs


def _recompute_layers_note(cfg, spec) -> str:
    """Accelerate checkpoints every decoder layer: how to recompute only the plan's first N."""
    # the decoder layers: GPT2LMHeadModel.transformer.h, the other causal LMs' .model.layers (transformers 5.23)
    blocks_path = "model.transformer.h" if spec.model_type == "gpt2" else "model.model.layers"
    return (
        f"recompute_layers={cfg.recompute_layers}: Accelerate and the Trainer checkpoint every decoder "
        "layer (this config: it fits, and runs slower than planned); for the plan's first "
        f"{cfg.recompute_layers} layers per chunk, leave it off and call torch.distributed.algorithms."
        "_checkpoint.checkpoint_wrapper.apply_activation_checkpointing(model, check_fn=lambda m: m in "
        f"{blocks_path}[:{cfg.recompute_layers}]) in the script"
    )


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _yaml(plan: Plan, doc: dict) -> str:
    lines = [f"# {h}" for h in header(plan, "Accelerate 1.15 FSDP / transformers 5.23 Trainer")]
    lines += [
        "# Run on every node (machine_rank 0 .. num_machines-1, MAIN_NODE_ADDRESS = node 0):",
        "#   accelerate launch --config_file THIS_FILE --machine_rank R --main_process_ip HOST train.py",
        f"# {devices_per_node(plan)} processes per node; train.py builds a Trainer with the TrainingArguments below.",
    ]
    for key, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


def _python_block(plan: Plan, targs: dict, config_cls: str, config_kwargs: dict, spec) -> str:
    """The Trainer side as a commented Python block (between the BEGIN/END markers)."""
    model_cls = HF_DECODER_LAYER[spec.model_type][1]
    code = [
        "from transformers import TrainingArguments, " + config_cls + ", " + model_cls,
        "",
        "training_args = TrainingArguments(",
    ]
    code += [f"    {k}={v!r}," for k, v in targs.items()]
    code += [
        ")",
        f"# sequences of {plan.config.seq} tokens (the data collator's block size); global batch "
        f"{plan.config.global_batch} = per_device_train_batch_size x {plan.config.dp} processes x "
        "gradient_accumulation_steps",
        f"model_config = {config_cls}(",
    ]
    code += [f"    {k}={v!r}," for k, v in config_kwargs.items()]
    code += [
        ")",
        f"model = {model_cls}(model_config)  # or {model_cls}.from_pretrained(...) of the same shape",
    ]
    return (
        "\n".join(
            ["# --- BEGIN train.py (Python) ---"]
            + [("# " + c).rstrip() for c in code]
            + ["# --- END train.py ---"]
        )
        + "\n"
    )
