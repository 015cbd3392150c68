"""Translate a plan into the configuration of an existing framework.

Each exporter is a pure function `Plan -> Export` (the file's text plus notes on what the target
cannot express exactly). Names and meanings of the targets' options:

- torchtitan `JobConfig` (torchtitan/config/job_config.py): [parallelism] data_parallel_replicate_degree,
  data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree,
  pipeline_parallel_schedule (torch.distributed.pipelining schedule names), pipeline_parallel_microbatch_size,
  pipeline_parallel_layers_per_stage / module_fqns_per_model_part; [activation_checkpoint] mode;
  [training] local_batch_size, global_batch_size, seq_len.
- Megatron-LM `arguments.py`: --tensor-model-parallel-size, --pipeline-model-parallel-size,
  --num-layers-per-virtual-pipeline-stage, --micro-batch-size, --global-batch-size, --sequence-parallel,
  --recompute-granularity/--recompute-method/--recompute-num-layers, --use-distributed-optimizer,
  --bf16/--fp16; rank order tp-dp-pp by default (placement "PDT"), tp-pp-dp with
  --use-tp-pp-dp-mapping (placement "DPT").
- DeepSpeed config JSON (deepspeed.readthedocs.io, "DeepSpeed Configuration JSON"):
  train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size.
- SageMaker model parallelism v1 `distribution` (docs.aws.amazon.com/sagemaker, "smdistributed
  model parallel configuration parameters"): pipeline_parallel_degree (alias partitions),
  tensor_parallel_degree, microbatches, placement_strategy (a permutation of D, P, T, or
  cluster/spread), pipeline "simple" (GPipe) or "interleaved" (forward/backward interleaved, 1F1B),
  ddp, shard_optimizer_state, sharded_data_parallel_degree, optimize "speed"/"memory".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from planner.errors import ConfigError
from planner.io import dumps_strict
from planner.partition import even_split
from planner.plan import Plan

FORMATS = ("torchtitan", "megatron", "deepspeed", "sagemaker")

TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                        "zero-bubble": "InterleavedZeroBubble"}
"""Planner schedule -> torch.distributed.pipelining schedule class name (minus 'Schedule')."""

_TORCH_DTYPE = {"fp32": "float32", "amp-bf16": "bfloat16", "amp-fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    """One exported configuration."""

    format: str
    """torchtitan, megatron, deepspeed or sagemaker."""
    text: str
    """The file's content (TOML, argument lines, or JSON)."""
    notes: tuple[str, ...] = ()
    """What the target cannot express exactly and how the export approximates it."""


def export_plan(plan: Plan, fmt: str) -> Export:
    """Dispatch to the exporter of `fmt`; an unknown format is a ConfigError."""
    exporters: dict[str, Callable[[Plan], Export]] = {
        "torchtitan": to_torchtitan, "megatron": to_megatron, "deepspeed": to_deepspeed,
        "sagemaker": to_sagemaker}
    if fmt not in exporters:
        raise ConfigError("format", fmt, "one of " + ", ".join(FORMATS))
    return exporters[fmt](plan)


def megatron_layout(stages) -> str:
    """Megatron-LM `--pipeline-model-parallel-layout` for blocks per model chunk, in layer order:
    [4, 5, 3] -> "Et*4|t*5|t*3L" (megatron.core.transformer.pipeline_parallel_layer_layout)."""
    parts = [f"t*{n}" for n in stages]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def _cannot(fmt: str, why: str) -> ConfigError:
    """The target cannot run this plan as it stands: an error, not a note (never a config that fails
    at launch or silently runs something else)."""
    return ConfigError("format", fmt, "a target that can run this plan",
                       message=f"cannot export to {fmt}: {why}")


def _layers(plan: Plan) -> int | None:
    model = plan.document.get("model", {})
    if plan.config.stages:
        return sum(plan.config.stages)
    return model.get("layers")


def _even_layers_per_stage(plan: Plan) -> int | None:
    """Blocks per (virtual) stage when every stage has the same count, else None."""
    cfg, layers = plan.config, _layers(plan)
    chunks = cfg.pp * cfg.virtual_stages
    if cfg.stages:
        return cfg.stages[0] if len(set(cfg.stages)) == 1 else None
    if layers is not None and layers % chunks == 0:
        return layers // chunks
    return None


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(type(value).__name__)


def _toml(sections: dict[str, dict], header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    for name, body in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in body.items())
    return "\n".join(lines) + "\n"


def _header(plan: Plan, target: str) -> list[str]:
    p = plan.prediction
    return [f"{target} configuration exported by `planner export` from a plan for {plan.model_name} on "
            f"{plan.gpus} x {plan.hardware_name}",
            f"predicted step {p.step_time_s:.3f} s, peak {p.memory.peak_bytes_per_gpu / 2**30:.1f} GiB per GPU"]


def to_torchtitan(plan: Plan) -> Export:
    """torchtitan job TOML: FSDP2 shards over dp (ZeRO-3, or ZeRO-2 without resharding), TP, PP."""
    cfg, notes = plan.config, []
    local_batch = cfg.global_batch // cfg.dp
    parallelism: dict[str, object] = {}
    if cfg.zero == 0:
        parallelism.update(data_parallel_replicate_degree=cfg.dp, data_parallel_shard_degree=1)
    else:
        parallelism.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=cfg.dp,
                           fsdp_reshard_after_forward="default" if cfg.zero == 3 else "never")
        if cfg.zero == 1:
            notes.append("torchtitan has no optimizer-only sharding (ZeRO-1); exported as FSDP2 without "
                         "resharding after forward (ZeRO-2), which holds the same parameters and less gradient memory")
    parallelism.update(tensor_parallel_degree=cfg.tp, pipeline_parallel_degree=cfg.pp,
                       context_parallel_degree=1)
    if cfg.pp > 1:
        parallelism.update(pipeline_parallel_schedule=TORCHTITAN_SCHEDULES[cfg.schedule],
                           pipeline_parallel_microbatch_size=cfg.micro_batch)
        per_stage = _even_layers_per_stage(plan)
        if per_stage is not None:
            parallelism["pipeline_parallel_layers_per_stage"] = per_stage
        elif cfg.stages or _layers(plan):
            stages = cfg.stages or even_split(_layers(plan), cfg.pp * cfg.virtual_stages)
            parallelism["module_fqns_per_model_part"] = _torchtitan_fqns(stages)
    elif cfg.num_microbatches > 1:
        notes.append(f"pp=1: torchtitan runs local_batch_size={local_batch} at once; set "
                     f"local_batch_size={cfg.micro_batch} and accumulate {cfg.num_microbatches} steps "
                     "if memory requires the plan's micro-batch")
    if cfg.tp > 1 and not cfg.sequence_parallel:
        notes.append("torchtitan always applies sequence parallelism to norms with TP; the plan did not")
    if cfg.offload == "optimizer":
        notes.append("offload=optimizer exported as FSDP2 CPU offload (parameters, gradients and "
                     "optimizer states on the host)")
    if cfg.offload == "activations":
        notes.append("torchtitan has no activation offload; not exported")
    if cfg.placement != "DPT":
        notes.append(f"torchtitan orders its mesh pp, dp, tp (placement PDT/DPT-like); placement "
                     f"{cfg.placement} is not expressible")
    training = {"local_batch_size": local_batch, "global_batch_size": cfg.global_batch, "seq_len": cfg.seq,
                "mixed_precision_param": _TORCH_DTYPE[cfg.precision],
                "enable_cpu_offload": cfg.offload == "optimizer"}
    ac = {"mode": cfg.recompute}
    if cfg.recompute == "selective":
        ac["selective_ac_option"] = "op"
    sections = {"model": {"name": plan.model_name}, "training": training, "parallelism": parallelism,
                "activation_checkpoint": ac}
    return Export(format="torchtitan", text=_toml(sections, _header(plan, "torchtitan")), notes=tuple(notes))


def _torchtitan_fqns(stages: tuple[int, ...]) -> list[list[str]]:
    """Module names per pipeline stage for torchtitan's llama layout (tok_embeddings, layers.i, norm, output)."""
    parts, start = [], 0
    for i, count in enumerate(stages):
        names = [f"layers.{j}" for j in range(start, start + count)]
        start += count
        if i == 0:
            names.insert(0, "tok_embeddings")
        if i == len(stages) - 1:
            names += ["norm", "output"]
        parts.append(names)
    return parts


def to_megatron(plan: Plan) -> Export:
    """Megatron-LM `pretrain_gpt.py` arguments, one option per line (comments start with '#')."""
    cfg, notes = plan.config, []
    model = plan.document.get("model", {})
    args: list[tuple[str, object]] = []
    for key, flag in (("layers", "--num-layers"), ("hidden", "--hidden-size"), ("heads", "--num-attention-heads")):
        if key in model:
            args.append((flag, model[key]))
    args += [("--seq-length", cfg.seq), ("--tensor-model-parallel-size", cfg.tp),
             ("--pipeline-model-parallel-size", cfg.pp), ("--micro-batch-size", cfg.micro_batch),
             ("--global-batch-size", cfg.global_batch)]
    layers = _layers(plan)
    chunks = cfg.pp * cfg.virtual_stages
    stages = tuple(cfg.stages) or (even_split(layers, chunks) if layers is not None and cfg.pp > 1 else ())
    if len(set(stages)) == 1 and cfg.virtual_stages > 1:
        args.append(("--num-layers-per-virtual-pipeline-stage", stages[0]))
    elif (cfg.virtual_stages == 1 and len(set(stages)) > 1 and len(set(stages[1:-1])) <= 1
          and (layers - stages[0] - stages[-1]) % max(1, cfg.pp - 2) == 0):
        # first/last stage sizes, the middle split evenly (Megatron-LM's older uneven option)
        args += [("--decoder-first-pipeline-num-layers", stages[0]),
                 ("--decoder-last-pipeline-num-layers", stages[-1])]
    elif len(set(stages)) > 1:
        # any split: megatron.core's PipelineParallelLayerLayout, one '|'-separated segment per model
        # chunk in layer order (chunk = virtual rank * pp + pipeline rank), E the embedding, L the loss
        args.append(("--pipeline-model-parallel-layout", f'"{megatron_layout(stages)}"'))
        notes.append("uneven stages exported as --pipeline-model-parallel-layout, which needs a Megatron-LM "
                     "recent enough to have it (2025); older versions split evenly")
    if cfg.sequence_parallel and cfg.tp > 1:
        args.append(("--sequence-parallel", None))
    if cfg.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    elif cfg.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    if cfg.zero >= 1:
        args.append(("--use-distributed-optimizer", None))
        if cfg.zero > 1:
            notes.append(f"Megatron's distributed optimizer shards optimizer states (ZeRO-1); ZeRO-{cfg.zero} "
                         "has no exact equivalent")
    if cfg.precision in ("amp-bf16", "bf16"):
        args.append(("--bf16", None))
    elif cfg.precision == "amp-fp16":
        args.append(("--fp16", None))
    if cfg.placement == "DPT":
        args.append(("--use-tp-pp-dp-mapping", None))
    elif cfg.placement != "PDT":
        notes.append(f"Megatron orders ranks tp-dp-pp (PDT) or tp-pp-dp (DPT); placement {cfg.placement} "
                     "is not expressible")
    if cfg.schedule == "gpipe":
        notes.append("Megatron has no GPipe schedule; it will run 1F1B (same time, less memory)")
    if cfg.schedule == "zero-bubble":
        notes.append("zero-bubble schedule: Megatron-LM mainline runs 1F1B; use the ZB fork for ZB-H1")
    if cfg.offload == "optimizer":
        args.append(("--optimizer-cpu-offload", None))
    elif cfg.offload == "activations":
        notes.append("activation offload has no Megatron-LM flag; not exported")
    lines = [f"# {h}" for h in _header(plan, "Megatron-LM")]
    lines += [flag if value is None else f"{flag} {value}" for flag, value in args]
    return Export(format="megatron", text="\n".join(lines) + "\n", notes=tuple(notes))


def to_deepspeed(plan: Plan) -> Export:
    """DeepSpeed config JSON (batch sizes, ZeRO stage and offload, precision, activation checkpointing)."""
    cfg, notes = plan.config, []
    zero: dict[str, object] = {"stage": cfg.zero}
    if cfg.offload == "optimizer":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if cfg.zero == 0:
            raise _cannot("deepspeed", "DeepSpeed offloads the optimizer only with ZeRO >= 1; the plan has "
                                       "offload=optimizer with ZeRO-0")
    if cfg.zero >= 2 and cfg.pp > 1:
        raise _cannot("deepspeed", f"DeepSpeed's PipelineEngine runs ZeRO stage 0 or 1 only; the plan has "
                                   f"pp={cfg.pp} with ZeRO-{cfg.zero}")
    doc: dict[str, object] = {
        "train_batch_size": cfg.global_batch,
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.num_microbatches,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.precision in ("amp-bf16", "bf16")},
        "fp16": {"enabled": cfg.precision == "amp-fp16"},
    }
    if cfg.recompute != "none" or cfg.offload == "activations":
        doc["activation_checkpointing"] = {"partition_activations": cfg.tp > 1,
                                           "contiguous_memory_optimization": True,
                                           "cpu_checkpointing": cfg.offload == "activations"}
    if cfg.tp > 1 or cfg.pp > 1:
        notes.append(f"DeepSpeed takes tp={cfg.tp} from the model code (mpu) and pp={cfg.pp} from "
                     f"PipelineModule(num_stages={cfg.pp}); its data-parallel size is then {cfg.dp}")
    return Export(format="deepspeed", text=dumps_strict(doc, "deepspeed configuration") + "\n", notes=tuple(notes))


def to_sagemaker(plan: Plan) -> Export:
    """The `distribution` argument of a SageMaker PyTorch estimator (model parallelism library v1)."""
    cfg, notes = plan.config, []
    parameters: dict[str, object] = {
        "pipeline_parallel_degree": cfg.pp,
        "partitions": cfg.pp,
        "tensor_parallel_degree": cfg.tp,
        "microbatches": cfg.num_microbatches,
        "placement_strategy": cfg.placement,
        "pipeline": "simple" if cfg.schedule == "gpipe" else "interleaved",
        "optimize": "speed",
        "auto_partition": not cfg.stages,
        "ddp": cfg.dp > 1,
        "shard_optimizer_state": cfg.zero >= 1,
        "prescaled_batch": False,
    }
    if cfg.zero == 3:
        parameters["sharded_data_parallel_degree"] = cfg.dp
    if cfg.precision in ("amp-bf16", "bf16"):
        parameters["bf16"] = True
    elif cfg.precision == "amp-fp16":
        parameters["fp16"] = True
    if cfg.offload != "none":
        parameters["offload_activations"] = cfg.offload == "activations"
    if cfg.virtual_stages > 1 or cfg.schedule == "zero-bubble":
        notes.append(f"SageMaker pipelines have no {cfg.schedule} schedule; exported as 'interleaved' (1F1B)")
    if cfg.stages:
        notes.append(f"uneven stages {list(cfg.stages)}: SageMaker places modules with smp.partition(i) "
                     "in the script; auto_partition is off")
    if cfg.recompute != "none":
        notes.append(f"recompute={cfg.recompute}: call smp.set_activation_checkpointing on the blocks")
    distribution = {"smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}},
                    "mpi": {"enabled": True, "processes_per_host": plan.document["hardware"].get(
                        "devices_per_node", max(1, plan.gpus // plan.nodes))}}
    return Export(format="sagemaker", text=dumps_strict(distribution, "sagemaker configuration") + "\n",
                  notes=tuple(notes))
