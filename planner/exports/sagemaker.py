"""SageMaker distributed training configurations.

`sagemaker` (SageMaker model parallelism v2 through SageMaker Python SDK v3, sagemaker 3.27.0 /
sagemaker-train 1.27.0): a JSON document with the `Torchrun` launcher settings and its `SMP`
parameters, the classes of `sagemaker.train.distributed`:
`ModelTrainer(..., distributed=Torchrun(process_count_per_node=..., smp=SMP(**doc["distributed"]["smp"])),
compute=Compute(instance_type=..., instance_count=...))`. SMP v2 has FSDP-style sharding
(hybrid_shard_degree), tensor, context and expert parallelism and activation offload; no pipeline
parallelism. Names and meanings: the SMP class docstring in sagemaker-train 1.27.0 and AWS's "SMP v2
core feature configuration parameters".

`sagemaker-v1` (SageMaker model parallelism v1 through SDK v2's PyTorch estimator, sagemaker
2.257.7): the `distribution` dict with `smdistributed.modelparallel.parameters` for pipeline plans.
SDK v3 removed `sagemaker.pytorch`; SMP v1 jobs need SDK v2. Names and meanings: SDK v2's
doc/api/training/smd_model_parallel_general.rst and its client-side check
`sagemaker.fw_utils.validate_mp_config` (placement_strategy "cluster" or "spread" only there).
"""

from __future__ import annotations


from planner.io import dumps_strict
from planner.exports.common import Export, cannot, chunk_blocks, devices_per_node
from planner.exports.limits import sagemaker_limits, sagemaker_v1_limits
from planner.plan import Plan, fp8_scaling_of

SMP_V1_PLACEMENT = {"DPT": "cluster", "TPD": "spread"}
"""SMP v1 placement_strategy names the SDK v2 accepts and the D/P/T order they mean (outermost first)."""


def _instance(plan: Plan) -> dict:
    return {
        "instance_type": "ml." + plan.hardware_name.removeprefix("ml."),
        "instance_count": plan.nodes,
    }


def to_sagemaker(plan: Plan) -> Export:
    """SMP v2 parameters and Torchrun settings for SageMaker Python SDK v3 (refusal for what SMP v2 lacks)."""
    refusals = sagemaker_limits(plan)
    if refusals:
        raise cannot("sagemaker", "; ".join(refusals))
    cfg, notes = plan.config, []
    smp: dict[str, object] = {"tensor_parallel_degree": cfg.tp}
    if cfg.zero >= 1:
        smp["hybrid_shard_degree"] = cfg.shard_group * cfg.cp
        if cfg.zero < 3:
            notes.append(
                f"ZeRO-{cfg.zero}: use FSDP sharding_strategy _HYBRID_SHARD_ZERO2 (or SHARD_GRAD_OP) in the "
                "script; ZeRO-1 has no FSDP form and runs as ZeRO-2 (less memory)"
            )
    else:
        smp["hybrid_shard_degree"] = cfg.cp
        notes.append(
            "ZeRO-0: wrap the model with FSDP sharding_strategy NO_SHARD; hybrid_shard_degree covers "
            "the context-parallel group only"
        )
    if cfg.cp > 1:
        smp["context_parallel_degree"] = cfg.cp
        notes.append(
            f"cp_comm={cfg.cp_comm}: pass cp_comm_type to torch.sagemaker.transform (SMP >= 2.6)"
        )
    if cfg.ep > 1:
        smp["expert_parallel_degree"] = cfg.ep
    if cfg.offloads("activations"):
        smp["sm_activation_offloading"] = True
    if cfg.offloads("optimizer"):
        notes.append(
            "offload=optimizer: FSDP CPUOffload(offload_params=True) in the script (parameters, gradients "
            "and optimizer states on the host: less GPU memory)"
        )
    if cfg.recompute != "none":
        which = (
            "the transformer blocks"
            if cfg.recompute_layers is None
            else f"the first {cfg.recompute_layers} transformer blocks of each pipeline chunk (recompute_layers)"
        )
        notes.append(
            f"recompute={cfg.recompute}: apply_activation_checkpointing on {which} in the script"
            + (" (SMP v2 checkpoints whole blocks)" if cfg.recompute == "selective" else "")
        )
    if cfg.precision == "fp8":
        notes.append(_fp8_note(fp8_scaling_of(plan.document)))
    elif cfg.precision != "fp32":
        notes.append(f"precision {cfg.precision}: FSDP MixedPrecision in the script")
    if cfg.num_microbatches > 1:
        notes.append(
            f"{cfg.num_microbatches} micro-batches of {cfg.micro_batch}: gradient accumulation in the script "
            f"(global batch {cfg.global_batch})"
        )
    doc = {
        "distributed": {
            "type": "Torchrun",
            "process_count_per_node": devices_per_node(plan),
            "smp": smp,
        },
        "compute": _instance(plan),
        "batch": {
            "global_batch": cfg.global_batch,
            "micro_batch_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": cfg.num_microbatches,
            "seq_len": cfg.seq,
        },
    }
    return Export(
        format="sagemaker",
        text=dumps_strict(doc, "sagemaker configuration") + "\n",
        notes=tuple(notes),
    )


def to_sagemaker_v1(plan: Plan) -> Export:
    """The `distribution` of a SageMaker SDK v2 PyTorch estimator with model parallelism v1."""
    refusals = sagemaker_v1_limits(plan)
    if refusals:
        raise cannot("sagemaker-v1", "; ".join(refusals))
    cfg, notes = plan.config, []
    placement = SMP_V1_PLACEMENT.get(cfg.placement)
    if placement is None:
        placement = "spread" if cfg.placement.startswith("T") else "cluster"
        notes.append(
            f"placement {cfg.placement}: SDK v2 accepts placement_strategy 'cluster' (DPT) or 'spread' (TPD) "
            f"only; exported as {placement!r} (same result, other links)"
        )
    parameters: dict[str, object] = {
        "pipeline_parallel_degree": cfg.pp,
        "partitions": cfg.pp,
        "tensor_parallel_degree": cfg.tp,
        "microbatches": cfg.num_microbatches,
        "placement_strategy": placement,
        "pipeline": "simple" if cfg.schedule == "gpipe" else "interleaved",
        "optimize": "speed",
        "ddp": cfg.dp > 1 or cfg.tp > 1,
        "prescaled_batch": False,
    }
    stages = chunk_blocks(plan)
    if cfg.pp > 1:
        parameters.update(auto_partition=False, default_partition=0)
        notes.append(
            f"stages {list(stages)}: auto_partition is off; put blocks in smp.partition(i) contexts in the "
            "script as listed (other modules go to default_partition 0)"
        )
    if cfg.zero == 1:
        parameters["shard_optimizer_state"] = True
    if cfg.zero == 3:
        parameters["sharded_data_parallel_degree"] = cfg.shard_group
    if cfg.precision in ("amp-bf16", "bf16"):
        parameters["bf16"] = True
    elif cfg.precision == "amp-fp16":
        parameters["fp16"] = True
    if cfg.offloads("activations"):
        parameters["offload_activations"] = True
    if cfg.virtual_stages > 1 or cfg.schedule == "zero-bubble":
        notes.append(
            f"SMP v1 has no {cfg.schedule} schedule (virtual_stages={cfg.virtual_stages}); exported as "
            "'interleaved', its 1F1B-style schedule (more bubble than planned, no more memory)"
        )
    if cfg.recompute != "none":
        which = (
            "the transformer blocks"
            if cfg.recompute_layers is None
            else f"the first {cfg.recompute_layers} transformer blocks of each pipeline stage (recompute_layers)"
        )
        notes.append(f"recompute={cfg.recompute}: smp.set_activation_checkpointing on {which}")
    distribution = {
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}},
        "mpi": {"enabled": True, "processes_per_host": devices_per_node(plan)},
    }
    notes.append(
        f"SDK v2: sagemaker.pytorch.PyTorch(distribution=<this>, instance_type="
        f"'{_instance(plan)['instance_type']}', instance_count={plan.nodes}, ...); SMP v1 needs a DLC with "
        "smdistributed-modelparallel"
    )
    return Export(
        format="sagemaker-v1",
        text=dumps_strict(distribution, "sagemaker-v1 configuration") + "\n",
        notes=tuple(notes),
    )


TE_RECIPES = {
    "tensorwise": "Float8CurrentScaling",
    "delayed": "DelayedScaling",
    "mxfp8": "MXFP8BlockScaling",
    "nvfp4": "NVFP4BlockScaling",
}
"""Transformer Engine's recipe class for each FP8 scaling the planner costs
(transformer_engine.common.recipe, TE 2.x); torchao's rowwise has none in TE."""


def _fp8_note(scaling: str) -> str:
    """How the script runs the plan's FP8 recipe under SMP v2 (TE's fp8_autocast)."""
    head = (
        "fp8: SMP v2 runs FP8 through Transformer Engine (torch.sagemaker.transform with "
        "transformer_engine fp8 autocast in the script)"
    )
    recipe = TE_RECIPES.get(scaling)
    if recipe is None:
        return (
            f"{head}; the plan was costed with fp8_scaling={scaling}, which Transformer Engine has "
            "no recipe for: the script's Float8CurrentScaling casts each operand once, less than "
            "costed"
        )
    where = f"transformer_engine.common.recipe.{recipe}()"
    needs = (
        "; it needs Transformer Engine >= 2.8 and FP4 tensor cores (Blackwell)"
        if scaling == "nvfp4"
        else ""
    )
    return f"{head}, with fp8_recipe={where} (fp8_scaling={scaling}){needs}"
