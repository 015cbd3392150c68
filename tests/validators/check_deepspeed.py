"""Read exported DeepSpeed configs with DeepSpeed's own DeepSpeedConfig and checkpointing.configure.

One list a line, one PLANNER-RESULT line each, until stdin closes (_serve.py).
stdin: JSON list of {"text": config JSON, "dp": data-parallel size, "tp": int, "pp": int}.
stdout: JSON list of {"ok": true, "config": {...}} or {"ok": false, "error": "..."}.

Shim: DeepSpeedConfig asks deepspeed.comm for the rank before it asks the mpu for the data-parallel
size; with no process group that fails and it assumes one rank, so the rank query answers 0 and a
minimal mpu object gives the plan's tp, pp and dp (what Megatron-DeepSpeed's mpu would give).
"""

import contextlib
import io
import json
import logging
import types

import torch
import deepspeed.runtime.config as ds_config  # noqa: E402
from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule  # noqa: E402
from deepspeed.runtime.activation_checkpointing import checkpointing  # noqa: E402

ds_config.dist.get_rank = lambda *a, **k: 0
logging.disable(logging.WARNING)


class Mpu:
    """The groups DeepSpeed asks a model-parallel unit for (sizes only; rank 0 everywhere)."""

    def __init__(self, dp, tp, pp):
        self.dp, self.tp, self.pp = dp, tp, pp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_model_parallel_world_size(self):
        return self.tp * self.pp

    def get_tensor_model_parallel_world_size(self):
        return self.tp

    def get_pipeline_model_parallel_world_size(self):
        return self.pp

    def get_data_parallel_rank(self):
        return 0

    get_model_parallel_rank = get_tensor_model_parallel_rank = get_pipeline_model_parallel_rank = (
        get_data_parallel_rank
    )

    def get_model_parallel_group(self):
        return None

    get_tensor_model_parallel_group = get_data_parallel_group = get_model_parallel_group


class EmbeddingPipe(torch.nn.Module):
    """Megatron-DeepSpeed's embedding (and tied head) layer class, by name only."""


class ParallelTransformerLayerPipe(torch.nn.Module):
    """Megatron-DeepSpeed's transformer block class, by name only."""


class MixedFusedLayerNorm(torch.nn.Module):
    """Megatron-DeepSpeed's final LayerNorm class, by name only."""


def _to_float16(x):
    return x


def _transpose(x):
    return x


def _to_float32(x):
    return x


def blocks_per_stage(method, blocks, stages):
    """Blocks per stage of DeepSpeed's own PipelineModule._partition_layers(method) over the layer
    specs of
    Megatron-DeepSpeed's GPTModelPipe (cast, embedding, transpose, the blocks, transpose, final
    norm, tied head,
    cast): the method runs on a stand-in for the module with only what it reads (no process
    group)."""
    specs = [
        _to_float16,
        LayerSpec(EmbeddingPipe),
        _transpose,
        *[LayerSpec(ParallelTransformerLayerPipe) for _ in range(blocks)],
        _transpose,
        LayerSpec(MixedFusedLayerNorm),
        LayerSpec(EmbeddingPipe),
        _to_float32,
    ]
    topology = types.SimpleNamespace(get_coord=lambda rank: types.SimpleNamespace(pipe=0))
    module = types.SimpleNamespace(
        num_stages=stages,
        global_rank=1,
        _layer_specs=specs,
        _topo=topology,
        _set_bounds=lambda start, stop: None,
    )
    module._find_layer_type = types.MethodType(PipelineModule._find_layer_type, module)
    PipelineModule._partition_layers(module, method=method)
    parts = module.parts
    return [
        sum(
            isinstance(spec, LayerSpec) and spec.typename is ParallelTransformerLayerPipe
            for spec in specs[parts[i] : parts[i + 1]]
        )
        for i in range(stages)
    ]


def _partition(config, item):
    """Blocks per stage of the exported partition_method (None without a pipeline)."""
    if item["pp"] == 1 or not item.get("blocks"):
        return None
    return blocks_per_stage(config.pipeline["partition_method"], item["blocks"], item["pp"])


def check(item):
    try:
        doc = json.loads(item["text"])
        mpu = Mpu(item["dp"], item["tp"], item["pp"])
        with contextlib.redirect_stdout(io.StringIO()):
            config = ds_config.DeepSpeedConfig(doc, mpu=mpu)
            ac = config.activation_checkpointing_config
            if "activation_checkpointing" in doc:
                checkpointing.configure(mpu, deepspeed_config=doc)
        zero = config.zero_config
        return {
            "ok": True,
            "config": {
                "world_size": config.world_size,
                "train_batch_size": config.train_batch_size,
                "micro_batch": config.train_micro_batch_size_per_gpu,
                "gradient_accumulation_steps": config.gradient_accumulation_steps,
                "zero_stage": int(zero.stage),
                "hpz_partition_size": zero.zero_hpz_partition_size,
                "offload_optimizer": None
                if zero.offload_optimizer is None
                else str(
                    getattr(zero.offload_optimizer.device, "value", zero.offload_optimizer.device)
                ),
                "bf16": config.bfloat16_config.enabled,
                "fp16": config.float16_config.enabled,
                "grad_accum_dtype": config.grad_accum_dtype,
                "partition_activations": ac.partition_activations,
                "cpu_checkpointing": ac.cpu_checkpointing,
                "contiguous_memory_optimization": ac.contiguous_memory_optimization,
                "number_checkpoints": ac.number_checkpoints,
                "checkpointing_configured": "activation_checkpointing" in doc,
                "pipeline": config.pipeline,
                "partition": _partition(config, item),
            },
        }
    except BaseException as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}


if __name__ == "__main__":
    from _serve import serve

    serve(lambda items, first: [check(item) for item in items])
