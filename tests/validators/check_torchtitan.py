"""Load exported torchtitan 0.3.0 job modules through torchtitan's own ConfigManager and check them.

stdin: JSON list of {"text": module source, "world_size": int}.
stdout: JSON list of {"ok": true, "config": {...}} or {"ok": false, "error": "..."}.

For each module: `ConfigManager().parse_args(["--module", M, "--config", "planner_job"])` (tyro
builds Trainer.Config, whose __post_init__ checks batch/pipeline/CUDA-graph rules), then
`ParallelDims.from_config` (degrees multiply to the world size), the model built on the meta device
(every name in module_fqns_per_model_part must be a module of it and every top-level module in some
part), and the torch.distributed.pipelining schedule class constructed with mock stages (stages per
rank and micro-batches it accepts), as torchtitan's `_build_pipeline_schedule` would.

Shims (see tests/validators/README.md): `datasets` (only imported by torchtitan's data loaders) and
torchtitan's triton kernel module for MinimalAsyncEP are stand-ins, so that neither the 100 MB
datasets/pyarrow stack nor the 280 MB triton wheel is needed; both raise if called. For fp8 jobs the
GPU capability check of Float8LinearConverter answers "SM90" (the plan's H100-class device).
"""
import contextlib
import importlib
import io
import json
import logging
import pathlib
import sys
import tempfile
import types
from unittest import mock


def _gpu_only(*args, **kwargs):
    raise RuntimeError("not available inside the config validator")


def _stand_in(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


_stand_in("torchtitan.distributed.minimal_async_ep.kernels",
          **{n: _gpu_only for n in ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel",
                                    "expand_topk_grad_kernel", "fill_combine_metadata_kernel",
                                    "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                                    "reduce_topk_slots_kernel", "topk_scores_grad_kernel")})
_datasets = _stand_in("datasets", Dataset=type("Dataset", (), {}), IterableDataset=type("IterableDataset", (), {}),
                      load_dataset=_gpu_only, concatenate_datasets=_gpu_only)
_datasets.distributed = _stand_in("datasets.distributed", split_dataset_by_node=_gpu_only)

import torch  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class  # noqa: E402

import torchtitan.components.quantization.float8 as float8  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402

float8.has_cuda_capability = lambda major, minor: (9, 0) >= (major, minor)
logging.disable(logging.WARNING)


def check(item, workdir, i):
    name = f"planner_job_{i}"
    (workdir / f"{name}.py").write_text(item["text"])
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            config = ConfigManager().parse_args(["--module", name, "--config", "planner_job"])
        par, tr = config.parallelism, config.training
        dims = ParallelDims.from_config(par, item["world_size"])
        model_cfg = config.model_spec.model
        with torch.device("meta"):
            model = model_cfg.build()
        top = [n for n, _ in model.named_children()]
        layers = [n for n, _ in model.layers.named_children()]
        parts = par.module_fqns_per_model_part
        blocks_per_part = None
        if par.pipeline_parallel_degree > 1:
            for part in parts:
                for fqn in part:
                    model.get_submodule(fqn)          # raises AttributeError for a name the model lacks
            named = {f for part in parts for f in part}
            missing = [n for n in top if n != "layers" and n not in named] + \
                      [f"layers.{n}" for n in layers if f"layers.{n}" not in named]
            if missing:
                raise ValueError(f"modules in no pipeline part: {missing[:5]}")
            blocks_per_part = [sum(f.startswith("layers.") for f in part) for part in parts]
            schedule = get_schedule_class(par.pipeline_parallel_schedule)
            per_rank, rest = divmod(len(parts), par.pipeline_parallel_degree)
            if rest:
                raise ValueError(f"{len(parts)} parts do not divide over pp={par.pipeline_parallel_degree}")
            multi = issubclass(schedule, PipelineScheduleMulti)
            if not multi and per_rank != 1:
                raise ValueError(f"single-stage schedule {schedule.__name__} with {per_rank} stages per rank")
            stages = []
            for _ in range(per_rank):
                stage = mock.create_autospec(PipelineStage, instance=True)
                stage.group_rank, stage.group_size, stage.submod = 0, par.pipeline_parallel_degree, None
                stage.num_stages = len(parts)
                stages.append(stage)
            n_micro = tr.local_batch_size // par.pipeline_parallel_microbatch_size
            schedule(stages if multi else stages[0], n_microbatches=n_micro)
        first = model_cfg.layers[0]
        attention = first.attention
        out = {
            "parallelism": {k: getattr(par, k) for k in (
                "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                "tensor_parallel_degree", "enable_sequence_parallel", "pipeline_parallel_degree",
                "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size", "context_parallel_degree",
                "expert_parallel_degree")},
            "dims": {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "cp": dims.cp, "tp": dims.tp,
                     "pp": dims.pp},
            "training": {k: getattr(tr, k) for k in (
                "local_batch_size", "global_batch_size", "seq_len", "dtype", "mixed_precision_param",
                "enable_cpu_offload", "disable_cuda_graphs")},
            "activation_checkpoint": None if config.activation_checkpoint is None
            else type(config.activation_checkpoint).__qualname__.split(".")[0],
            "checkpoint_interval": config.checkpoint.interval,
            "model": {"layers": len(layers), "top": top, "dim": model_cfg.dim, "vocab": model_cfg.vocab_size,
                      "tied": bool(getattr(model_cfg, "enable_weight_tying", False)),
                      "n_heads": attention.n_heads, "n_kv_heads": attention.n_kv_heads,
                      "ffn_hidden": first.feed_forward.w1.out_features if hasattr(first.feed_forward, "w1")
                      else None,
                      "params": sum(p.numel() for p in model.parameters()),
                      "linear_types": sorted({type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__})},
            "blocks_per_part": blocks_per_part,
        }
        return {"ok": True, "config": json.loads(json.dumps(out, default=str))}
    except BaseException as err:  # tyro exits with SystemExit on a bad field: reported, not raised
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}


if __name__ == "__main__":
    items = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        print("PLANNER-RESULT " + json.dumps([check(item, pathlib.Path(tmp), i) for i, item in enumerate(items)]))
