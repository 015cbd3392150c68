"""Load exported torchtitan 0.3.0 job modules through torchtitan's own ConfigManager and check them.

One list a line, one PLANNER-RESULT line each, until stdin closes (_serve.py).
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
datasets/pyarrow stack nor the 280 MB triton wheel is needed; both raise if called. `deep_ep` (DeepEP
>= 2, CUDA + NVSHMEM) is a stand-in whose ElasticBuffer is sized and constructed as torchtitan's
DeepEPTokenDispatcher asks when its mesh is wired, and has no communication methods. For fp8 jobs the
GPU capability checks of Float8LinearConverter and Float8GroupedExpertsConverter answer "SM90" (the
plan's H100-class device).

Mixture-of-experts jobs also report (`moe`) the blocks with experts, the last MoE block's router,
routed and shared experts and token dispatcher, the attention (MLA dims, head_dim, QK-norm, windows,
RoPE), the MTP layers and the mesh dimensions of rank 0's routed-expert weights after parallelization.
"""

import contextlib
import io
import json
import logging
import pathlib
import sys
import tempfile
import types


def _gpu_only(*args, **kwargs):
    raise RuntimeError("not available inside the config validator")


def _stand_in(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


_stand_in(
    "torchtitan.distributed.minimal_async_ep.kernels",
    **{
        n: _gpu_only
        for n in (
            "copy_full_counts_to_peers_kernel",
            "copy_rows_to_peers_kernel",
            "expand_topk_grad_kernel",
            "fill_combine_metadata_kernel",
            "fill_dispatch_metadata_kernel",
            "invert_flat_indices_kernel",
            "reduce_topk_slots_kernel",
            "topk_scores_grad_kernel",
        )
    },
)
_datasets = _stand_in(
    "datasets",
    Dataset=type("Dataset", (), {}),
    IterableDataset=type("IterableDataset", (), {}),
    load_dataset=_gpu_only,
    concatenate_datasets=_gpu_only,
)
_datasets.distributed = _stand_in("datasets.distributed", split_dataset_by_node=_gpu_only)


class _ElasticBuffer:
    """deep_ep.ElasticBuffer as torchtitan/distributed/deepep/deepep.py get_buffer creates it; nothing else."""

    @staticmethod
    def get_buffer_size_hint(
        group, num_max_tokens_per_rank, hidden, *, num_topk, use_fp8_dispatch=False
    ):
        return num_max_tokens_per_rank * hidden * num_topk

    def __init__(self, group, *, num_bytes, **kwargs):
        self.group, self.num_bytes = group, num_bytes


_stand_in("deep_ep", ElasticBuffer=_ElasticBuffer)

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import torchtitan.components.quantization.float8 as float8  # noqa: E402
import torchtitan.distributed.parallel_dims as parallel_dims_module  # noqa: E402
import torchtitan.distributed.utils as dist_utils  # noqa: E402
import torchtitan.tools.utils as torchtitan_utils  # noqa: E402
from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.models.common.attention import FlexAttention  # noqa: E402

# meshes on this CPU machine: torchtitan picks "cuda" when no accelerator is found
parallel_dims_module.device_type = dist_utils.device_type = torchtitan_utils.device_type = "cpu"

float8.has_cuda_capability = lambda major, minor: (9, 0) >= (major, minor)
logging.disable(logging.WARNING)


def _fake_world(world_size):
    """A fake process group of `world_size` ranks (this process is rank 0): collectives return at once,
    so DeviceMesh, DTensor sharding and FSDP2 wrapping run as on rank 0 of the real job."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def _owner(config):
    """The module class a torchtitan config builds (its Config is nested in it: GroupedExperts.Config)."""
    return type(config).__qualname__.split(".")[-2]


def _moe(model_cfg, parts):
    """The mixture-of-experts model as torchtitan built it (None for a dense model): its MoE and dense blocks,
    the last MoE block's router, routed and shared experts, the attention of the last block, the MTP layers,
    and the mesh dimensions of rank 0's routed-expert weights after parallelization."""
    layers = model_cfg.layers
    moe_ids = [i for i, layer in enumerate(layers) if getattr(layer, "moe", None) is not None]
    if not moe_ids:
        return None
    moe = layers[moe_ids[-1]].moe
    router, inner, shared = moe.router, moe.routed_experts.inner_experts, moe.shared_experts
    dense = [layer for layer in layers if getattr(layer, "moe", None) is None]
    attention = layers[-1].attention
    expert_mesh = sorted(
        {
            ",".join(p.device_mesh.mesh_dim_names or ()) if isinstance(p, DTensor) else "plain"
            for part in parts
            for name, p in part.named_parameters()
            if ".routed_experts." in name
        }
    )
    return {
        "moe_layers": moe_ids,
        "dense_hidden": dense[0].feed_forward.w1.out_features if dense else None,
        "experts": inner.num_experts,
        "expert_hidden": inner.hidden_dim,
        "experts_class": _owner(inner),
        "top_k": router.top_k,
        "score_func": router.score_func,
        "route_norm": router.route_norm,
        "route_scale": router.route_scale,
        "num_expert_groups": router.num_expert_groups,
        "num_limited_groups": router.num_limited_groups,
        "gate_bias": router.gate.bias,
        "load_balance_coeff": moe.load_balance_coeff,
        "dispatcher": _owner(moe.routed_experts.token_dispatcher),
        "shared_hidden": shared.w1.out_features if shared is not None else 0,
        "mla": {
            k: getattr(attention, k)
            for k in (
                "q_lora_rank",
                "kv_lora_rank",
                "qk_nope_head_dim",
                "qk_rope_head_dim",
                "v_head_dim",
            )
        }
        if hasattr(attention, "kv_lora_rank")
        else None,
        "head_dim": getattr(attention, "head_dim", None),
        "qk_norm": getattr(attention, "qk_norm", None) is not None,
        "windows": {
            i: layer.attention.sliding_window_size
            for i, layer in enumerate(layers)
            if getattr(layer.attention, "sliding_window_size", None)
        },
        "rope": [
            _owner(attention.rope),
            attention.rope.dim,
            attention.rope.theta,
            attention.rope.scaling,
        ],
        "mtp_layers": len(getattr(model_cfg, "mtp_layers", None) or []),
        "expert_mesh": expert_mesh,
    }


def _placements(model):
    """{mesh dim names: parameters} of the DTensor parameters after parallelization."""
    out = {}
    for _, p in model.named_parameters():
        if isinstance(p, DTensor):
            key = ",".join(p.device_mesh.mesh_dim_names or ())
            out[key] = out.get(key, 0) + 1
        else:
            out["plain"] = out.get("plain", 0) + 1
    return out


def _sdpa_on_cpu(
    q,
    k,
    v,
    *,
    score_mod=None,
    block_mask=None,
    scale=None,
    enable_gqa=False,
    return_aux=None,
    kernel_options=None,
):
    """Causal attention for the CPU forward/backward check (FlexAttention has no CPU backward)."""
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa
    ), None


def _forward(parts, model_cfg, shape):
    """Materialize rank 0's model parts on the CPU, initialize them as the trainer does and run the first
    one forward and backward on random tokens: the tensor/sequence-parallel placements of every module
    must compose (the fake process group returns unreduced values, so only shapes and types are checked)."""
    FlexAttention.compiled_flex_attn = staticmethod(_sdpa_on_cpu)
    for part in parts:
        part.to_empty(device="cpu")
        with torch.no_grad():
            part.init_weights(buffer_device=None)
        part.train()
    part = parts[0]
    batch, seq = shape["batch"], shape["seq"]
    tokens = torch.randint(0, model_cfg.vocab_size, (batch, seq))
    positions = torch.arange(seq).unsqueeze(0).expand(batch, -1)
    x = tokens if part.tok_embeddings is not None else torch.randn(batch, seq, model_cfg.dim)
    out = part(x, positions, part.get_attention_masks(positions))
    local = out.to_local() if isinstance(out, DTensor) else out
    local.float().sum().backward()
    grads = sum(p.grad is not None for p in part.parameters())
    return {
        "output": list(out.shape),
        "params_with_grad": grads,
        "params": sum(1 for _ in part.parameters()),
    }


def _batch(config, dims):
    """What the trainer runs per step, as torchtitan 0.3.0's Trainer.__init__ computes it
    (trainer.py:
    the batch mesh, 'verify batch sizes', gradient_accumulation_steps,
    num_pipeline_parallel_microbatches and the dataloader's batch size, lines copied with their
    asserts)."""
    tr, par = config.training, config.parallelism
    local, pp_micro_size = tr.local_batch_size, par.pipeline_parallel_microbatch_size
    batch_degree = dims.get_mesh("batch").size() if dims.dp_enabled else 1
    global_batch = tr.global_batch_size if tr.global_batch_size > 0 else local * batch_degree
    assert global_batch % (local * batch_degree) == 0, "global batch not a multiple"
    accumulation = global_batch // (local * batch_degree)
    pp_micro = local // pp_micro_size if dims.pp_enabled else 1
    forward = pp_micro_size if dims.pp_enabled else local
    return {
        "batch_degree": batch_degree,
        "global_batch": global_batch,
        "accumulation_steps": accumulation,
        "pp_microbatches": pp_micro,
        "sequences_per_forward": forward,
    }


def check(item, workdir, i):
    name = f"planner_job_{i}"
    (workdir / f"{name}.py").write_text(item["text"])
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            config = ConfigManager().parse_args(["--module", name, "--config", "planner_job"])
        par, tr = config.parallelism, config.training
        _fake_world(item["world_size"])
        dims = ParallelDims.from_config(par, item["world_size"])
        dims.build_mesh()
        dist_utils.set_spmd_backend(par.spmd_backend)
        spec = config.model_spec
        model_cfg = spec.model
        model_cfg.update_from_config(config=config)
        with torch.device("meta"), torchtitan_utils.set_default_dtype(TORCH_DTYPE_MAP[tr.dtype]):
            model = model_cfg.build()
        model.verify_module_protocol()
        top = [n for n, _ in model.named_children()]
        layers = [n for n, _ in model.layers.named_children()]
        params = sum(p.numel() for p in model.parameters())
        linear_types = sorted(
            {type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__}
        )
        parts = par.module_fqns_per_model_part
        blocks_per_part = schedule_name = n_micro = None
        if par.pipeline_parallel_degree > 1:
            for part in parts:
                for fqn in part:
                    model.get_submodule(fqn)  # raises AttributeError for a name the model lacks
            named = {f for part in parts for f in part}
            missing = [
                n for n in top if n != "layers" and n not in named and getattr(model, n) is not None
            ] + [f"layers.{n}" for n in layers if f"layers.{n}" not in named]
            if missing:
                raise ValueError(f"modules in no pipeline part: {missing[:5]}")
            blocks_per_part = [sum(f.startswith("layers.") for f in part) for part in parts]
            loss_fn = config.loss.build(compile_config=config.compile)
            schedule, model_parts, _, _ = spec.pipelining_fn(
                model,
                parallel_dims=dims,
                training=tr,
                parallelism=par,
                compile_config=config.compile,
                ac_config=config.activation_checkpoint,
                dump_folder=config.dump_folder,
                device=torch.device("cpu"),
                model_config=model_cfg,
                parallelize_fn=spec.parallelize_fn,
                loss_fn=loss_fn,
            )
            schedule_name, n_micro = type(schedule).__name__, schedule._n_microbatches
            rank0_parts = [sorted(n for n, _ in m.layers.named_children()) for m in model_parts]
            placements = _placements(model_parts[0])
        else:
            model = spec.parallelize_fn(
                model,
                parallel_dims=dims,
                training=tr,
                parallelism=par,
                compile_config=config.compile,
                ac_config=config.activation_checkpoint,
                dump_folder=config.dump_folder,
            )
            rank0_parts = [sorted(n for n, _ in model.layers.named_children())]
            placements = _placements(model)
        parts_on_rank0 = model_parts if par.pipeline_parallel_degree > 1 else [model]
        moe = _moe(model_cfg, parts_on_rank0)
        forward = (
            _forward(parts_on_rank0, model_cfg, item["forward"]) if item.get("forward") else None
        )
        first = model_cfg.layers[-1]
        attention = first.attention
        ffn = first.feed_forward if first.feed_forward is not None else None
        out = {
            "parallelism": {
                k: getattr(par, k)
                for k in (
                    "data_parallel_replicate_degree",
                    "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward",
                    "tensor_parallel_degree",
                    "enable_sequence_parallel",
                    "pipeline_parallel_degree",
                    "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size",
                    "context_parallel_degree",
                    "expert_parallel_degree",
                    "spmd_backend",
                )
            },
            "dims": {
                "dp_replicate": dims.dp_replicate,
                "dp_shard": dims.dp_shard,
                "cp": dims.cp,
                "tp": dims.tp,
                "pp": dims.pp,
                "ep": dims.ep,
            },
            "training": {
                k: getattr(tr, k)
                for k in (
                    "local_batch_size",
                    "global_batch_size",
                    "seq_len",
                    "dtype",
                    "mixed_precision_param",
                    "enable_cpu_offload",
                    "disable_cuda_graphs",
                )
            },
            "activation_checkpoint": None
            if config.activation_checkpoint is None
            else type(config.activation_checkpoint).__qualname__.split(".")[0],
            # blocks of each of rank 0's model parts that the policy wrapped for recomputation
            "ac_wrapped": [
                sum(
                    isinstance(block, CheckpointWrapper)
                    for _, block in part.layers.named_children()
                )
                for part in parts_on_rank0
            ],
            "checkpoint_interval": config.checkpoint.interval,
            "model": {
                "name": spec.name,
                "flavor": spec.flavor,
                "layers": len(layers),
                "top": top,
                "dim": model_cfg.dim,
                "vocab": model_cfg.vocab_size,
                "tied": bool(getattr(model_cfg, "enable_weight_tying", False)),
                "n_heads": attention.n_heads,
                "n_kv_heads": getattr(attention, "n_kv_heads", None),
                "ffn_hidden": ffn.w1.out_features if ffn is not None else None,
                "moe_layers": sum(
                    getattr(layer, "moe", None) is not None for layer in model_cfg.layers
                ),
                "params": params,
                "linear_types": linear_types,
            },
            "batch": _batch(config, dims),
            "blocks_per_part": blocks_per_part,
            "schedule": schedule_name,
            "n_microbatches": n_micro,
            "rank0_parts": rank0_parts,
            "placements": placements,
            "forward": forward,
            "moe": moe,
            "loss": type(config.loss).__qualname__.split(".")[0],
        }
        return {"ok": True, "config": json.loads(json.dumps(out, default=str))}
    except BaseException as err:  # tyro exits with SystemExit on a bad field: reported, not raised
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}


if __name__ == "__main__":
    from _serve import serve

    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        serve(
            lambda items, first: [
                check(item, pathlib.Path(tmp), first + i) for i, item in enumerate(items)
            ]
        )
