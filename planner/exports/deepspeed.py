"""DeepSpeed config JSON (DeepSpeed 0.19.8: deepspeed/runtime/config.py `DeepSpeedConfig`, ZeRO
options in deepspeed/runtime/zero/config.py, activation checkpointing in
deepspeed/runtime/activation_checkpointing/config.py).

Pass the file as `deepspeed.initialize(..., config=FILE)` (or `--deepspeed_config FILE`). What does
not live in the JSON comes as notes: the tensor-parallel degree (the model's mpu, e.g.
Megatron-DeepSpeed's --tensor-model-parallel-size), the pipeline (`PipelineModule(num_stages=pp)`),
and the model calling `deepspeed.checkpointing` for the activation_checkpointing block to act.
"""

from __future__ import annotations

from planner.io import dumps_strict
from planner.exports.common import Export, cannot, chunk_blocks, dp_replicas, model_moe, model_spec
from planner.exports.limits import deepspeed_limits
from planner.plan import Plan


def to_deepspeed(plan: Plan) -> Export:
    """DeepSpeed config for the plan (refusal when DeepSpeed cannot run it)."""
    refusals = deepspeed_limits(plan)
    if refusals:
        raise cannot("deepspeed", "; ".join(refusals))
    cfg, notes = plan.config, []
    doc: dict[str, object] = {
        "train_batch_size": cfg.global_batch,
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.num_microbatches,
        "zero_optimization": _zero_section(plan, notes),
        "bf16": {"enabled": cfg.precision in ("amp-bf16", "bf16")},
        "fp16": {"enabled": cfg.precision == "amp-fp16", "loss_scale": 0},
    }
    _bf16_optimizer(plan, doc, notes)
    if cfg.recompute != "none" or cfg.offloads("activations"):
        doc["activation_checkpointing"] = _activation_checkpointing(cfg, notes)
    if cfg.pp > 1:
        doc["pipeline"] = _pipeline(plan)
        notes += _pipeline_notes(cfg)
    if cfg.cp > 1:
        # DeepSpeed-Ulysses (all-to-all over heads): the ALST integration reads sequence_parallel_size from the
        # config (deepspeed/__init__.py, runtime/sequence_parallel/ulysses_sp.py); Megatron-DeepSpeed takes
        # --ds-sequence-parallel-size and refuses it together with Megatron's --sequence-parallel
        doc["sequence_parallel_size"] = cfg.cp
    notes += _model_parallel_notes(cfg)
    notes += _model_code_notes(plan)
    text = dumps_strict(doc, "deepspeed configuration")
    return Export(format="deepspeed", text=text + "\n", notes=tuple(notes))


def _zero_section(plan: Plan, notes: list[str]) -> dict[str, object]:
    """zero_optimization: the stage, overlap, optimizer offload and ZeRO++ hpZ for dp_shard."""
    cfg = plan.config
    zero: dict[str, object] = {"stage": cfg.zero}
    if cfg.zero >= 1 and cfg.dp > 1:
        zero.update(overlap_comm=True, contiguous_gradients=True)
    if cfg.offloads("optimizer"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if dp_replicas(plan) > 1:
        if cfg.zero == 3:
            zero["zero_hpz_partition_size"] = cfg.shard_group
            notes.append(
                f"dp_shard={cfg.shard_group}: ZeRO++ hpZ (zero_hpz_partition_size) keeps a secondary copy of the "
                f"parameters sharded within groups of {cfg.shard_group} ranks for the gathers, while optimizer "
                f"states and gradients stay sharded over all {cfg.dp} ranks (no more memory than HSDP); "
                "DeepSpeed 0.19 removed MiCS (mics_shard_size)"
            )
        else:
            notes.append(
                f"dp_shard={cfg.shard_group}: DeepSpeed shards ZeRO-{cfg.zero} states over all {cfg.dp} "
                "data-parallel ranks (hybrid sharding exists for ZeRO-3 only): less memory, more traffic"
            )
    return zero


def _bf16_optimizer(plan: Plan, doc: dict[str, object], notes: list[str]) -> None:
    """bf16 keeps fp32 master weights; the plan's bf16_optimizer sets ZeRO stage 1 with fp32
    gradient accumulation."""
    if plan.config.precision == "bf16":
        notes.append(
            "precision bf16: DeepSpeed keeps fp32 master weights in its optimizer (as amp-bf16)"
        )
    if (plan.document.get("software") or {}).get("bf16_optimizer"):
        # DeepSpeed runs BF16_Optimizer for bf16 with ZeRO stage 1 and fp32 gradient accumulation
        # (runtime/engine.py _do_optimizer_sanity_check), the optimizer the plan was costed with
        doc["zero_optimization"]["stage"] = 1
        doc["data_types"] = {"grad_accum_dtype": "fp32"}
        notes.append(
            "bf16_optimizer: ZeRO stage 1 with data_types.grad_accum_dtype fp32 runs DeepSpeed's BF16_Optimizer"
        )


def _activation_checkpointing(cfg, notes: list[str]) -> dict[str, object]:
    """The activation_checkpointing section (and how the model must use it)."""
    # the plan is costed with each checkpointed block input whole on every tensor-parallel rank (DeepSpeed's
    # default): partition_activations would keep 1/tp of it and all-gather it before each recomputation
    ac: dict[str, object] = {
        "partition_activations": False,
        "contiguous_memory_optimization": False,
        "cpu_checkpointing": cfg.offloads("activations"),
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }
    if cfg.tp > 1 and cfg.recompute == "full":
        notes.append(
            f"activation_checkpointing.partition_activations is off, as the plan is costed; on, each "
            f"checkpointed block input keeps 1/{cfg.tp} per tensor-parallel rank (less memory than the "
            "plan) and is all-gathered before its recomputation (Megatron-DeepSpeed: --partition-activations)"
        )
    notes.append(
        "activation_checkpointing acts only where the model calls deepspeed.checkpointing.checkpoint "
        "(Megatron-DeepSpeed: --checkpoint-activations --deepspeed-activation-checkpointing; "
        "PipelineModule(activation_checkpoint_interval=1))"
    )
    if cfg.recompute == "selective":
        notes.append(
            "recompute=selective: DeepSpeed checkpoints whole blocks; Megatron-DeepSpeed's "
            "--recompute-granularity selective gives the plan's attention-core recompute"
        )
    return ac


def _pipeline_notes(cfg) -> list[str]:
    """How to build and train the PipelineModule, and the schedule DeepSpeed runs."""
    notes = [
        f"pipeline: build the model as deepspeed.pipe.PipelineModule(layers=..., "
        f"num_stages={cfg.pp}, partition_method={PARTITION_METHOD!r}) "
        "(pipeline.partition_method: a regex matching the transformer block's class "
        "only; PipelineModule's default 'parameters' splits otherwise) and train with "
        "engine.train_batch(); DeepSpeed runs its 1F1B TrainSchedule with "
        f"gradient_accumulation_steps={cfg.num_microbatches} micro-batches"
    ]
    if cfg.schedule in ("gpipe", "zero-bubble"):
        notes.append(
            f"schedule {cfg.schedule}: DeepSpeed's PipelineEngine runs 1F1B (more "
            "bubble than planned, no more memory)"
        )
    return notes


def _model_parallel_notes(cfg) -> list[str]:
    """Context (Ulysses) and tensor parallelism, which come from the model code."""
    notes = []
    if cfg.cp > 1:
        notes.append(
            f"context parallelism cp={cfg.cp} is DeepSpeed-Ulysses: Megatron-DeepSpeed "
            f"--ds-sequence-parallel-size {cfg.cp} (without --sequence-parallel); Hugging Face models: "
            f"UlyssesSPAttentionHF.register_with_transformers(..., sequence_parallel_size={cfg.cp}) and its "
            "UlyssesSPDataLoaderAdapter; gradients are reduced over data x sequence-parallel ranks"
        )
    if cfg.tp > 1 or cfg.cp > 1:
        notes.append(
            f"tensor parallelism tp={cfg.tp} comes from the model code (Megatron-DeepSpeed: "
            f"--tensor-model-parallel-size {cfg.tp} --pipeline-model-parallel-size {cfg.pp}"
            f"{' --sequence-parallel' if cfg.sequence_parallel else ''}); DeepSpeed's data-parallel size is then "
            f"world/(tp*pp{'*cp' if cfg.cp > 1 else ''}) = {cfg.dp}"
        )
    return notes


def _model_code_notes(plan: Plan) -> list[str]:
    """Mixture-of-experts blocks and MLA / MTP / QK-norm, which the model code must provide."""
    cfg, notes = plan.config, []
    moe, spec = model_moe(plan), model_spec(plan)
    if moe is not None:
        notes.append(
            "mixture-of-experts: the JSON has no MoE section; build each MoE block in the model code as "
            f"deepspeed.moe.layer.MoE(hidden_size={spec.hidden}, expert=<MLP of width {moe.expert_ffn}>, "
            f"num_experts={moe.experts}, ep_size={cfg.ep}, k={moe.top_k}, use_residual={bool(moe.shared_experts)}, "
            + (
                "drop_tokens=False"
                if moe.capacity_factor is None
                else f"capacity_factor={moe.capacity_factor}"
            )
            + (", enable_expert_tensor_parallelism=True" if cfg.expert_tp > 1 else "")
            + f") from block {moe.first_dense_layers} on, and pass the optimizer "
            "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer (Megatron-DeepSpeed: "
            f"--num-experts {moe.experts} --moe-expert-parallel-size {cfg.ep} --topk {moe.top_k})"
        )
    elif cfg.ep > 1:
        notes.append(
            f"expert parallelism: deepspeed.moe.layer.MoE(ep_size={cfg.ep}, ...) in the model code"
        )
    if spec is not None and (spec.mla is not None or spec.mtp_modules or spec.qk_norm):
        # dense models too: Megatron-DeepSpeed's GPT (the tp/pp model code above) has none of them
        notes.append(
            "MLA / MTP / QK-norm are model code DeepSpeed does not provide (nor Megatron-DeepSpeed's GPT "
            "model); the config is the same"
        )
    return notes


PARTITION_METHOD = "type:transformer"
"""PipelineModule's partition_method for the plan's split: weight 1 on each layer spec whose class
matches (the
blocks: Megatron-DeepSpeed's ParallelTransformerLayerPipe), 0 elsewhere; DeepSpeed 0.19.8's
partition_balanced
(runtime/utils.py) then gives the even split with the remainder on the first stages, the only split
a DeepSpeed
plan has (frameworks/deepspeed.json capabilities.uneven_stages false;
planner.partition.even_split)."""


def _pipeline(plan: Plan) -> dict[str, object]:
    """The `pipeline` section: DeepSpeed's own keys, plus the partition method and the blocks per
    stage it gives
    (DeepSpeedConfig keeps every key of the section; PipelineModule takes partition_method as an
    argument)."""
    cfg = plan.config
    return {
        "stages": cfg.pp,
        "activation_checkpoint_interval": 1 if cfg.recompute == "full" else 0,
        "partition_method": PARTITION_METHOD,
        "blocks_per_stage": list(chunk_blocks(plan)),
    }
