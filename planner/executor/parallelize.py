"""Small `apply_*` functions that parallelize a plain `Transformer` by module name (torchtitan's
`parallelize.py`): the worker composes them in order pipeline split -> TP -> AC -> DP.

Every function uses PyTorch's own API: `torch.distributed.tensor.parallel` (Megatron's column/row
split, Shoeybi et al. 2019, and sequence parallelism, Korthikanti et al. 2022), `torch.utils.checkpoint`,
DDP / FSDP2 `fully_shard` (ZeRO, Rajbhandari et al. 2020), `torch.distributed.pipelining`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.parallel import LOOPED_SCHEDULES, ParallelConfig
from planner.placement import with_context
from planner.plan import mesh_dims


@dataclass(frozen=True, kw_only=True, slots=True)
class Meshes:
    """The plan's DeviceMesh and the sub-meshes the apply_* functions take."""

    root: Any
    """Dims in placement order (C inserted just outside T when the placement has none; D split into
    dp_replicate x dp_shard for hybrid sharding)."""
    dp: Any
    """The data-parallel ranks (1-D; flattened replicate x shard with hybrid sharding): which rows of
    the global batch a rank trains on."""
    pp: Any
    tp: Any
    cp: Any
    grad: Any
    """The ranks that hold the same (dense) parameters and average their gradients: dp x cp, 1-D; with
    hybrid sharding 2-D (dp_replicate, dp_shard x cp), FSDP2's HSDP mesh (shard inside, replicate across)."""
    hybrid: bool

    @property
    def grad_size(self) -> int:
        return self.grad.size()


def mesh_names(config: ParallelConfig) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(names, sizes) of the executor's mesh: planner.plan.mesh_dims of the placement, with C inserted
    just outside T when absent (planner.placement.with_context, the cost model's own rule) and, with
    hybrid sharding (0 < dp_shard < dp under ZeRO), dp split into (dp_replicate, dp_shard), shard
    innermost: shard groups are dp_shard consecutive dp indices (torchtitan's dp_replicate x dp_shard;
    planner.placement's 'S' and 'R' groups)."""
    import dataclasses

    if "C" not in config.placement:
        config = dataclasses.replace(config, placement=with_context(config.placement))
    names, shape = mesh_dims(config)
    if not is_hybrid(config):
        return names, shape
    i = names.index("dp")
    return (
        names[:i] + ("dp_replicate", "dp_shard") + names[i + 1 :],
        shape[:i] + (config.dp // config.dp_shard, config.dp_shard) + shape[i + 1 :],
    )


def is_hybrid(config: ParallelConfig) -> bool:
    """Hybrid sharding: ZeRO states sharded over dp_shard ranks and replicated over dp / dp_shard groups."""
    return config.zero > 0 and 0 < config.dp_shard < config.dp


def build_device_mesh(config: ParallelConfig, device_type: str) -> Meshes:
    """The plan's DeviceMesh, dims ordered by the placement string (mesh_names), and its sub-meshes.

    Worked example, dp=2 pp=2 tp=2, placement "DPT": mesh (dp, pp, cp, tp) = (2, 2, 1, 2), rank =
    4*dp_index + 2*pp_index + tp_index, so tp groups are adjacent ranks [0,1] [2,3] ..., pp groups
    [0,2] [1,3] [4,6] [5,7] and dp groups [0,4] [1,5] [2,6] [3,7]. Size-1 dims are kept. With
    cp=2 and placement "DPCT" (dp=2, tp=2): cp groups [0,2] [1,3] [4,6] [5,7], gradient groups
    (dp x cp) [0,2,4,6] and [1,3,5,7].
    """
    import warnings

    from torch.distributed.device_mesh import init_device_mesh

    names, shape = mesh_names(config)
    root = init_device_mesh(device_type, shape, mesh_dim_names=names)
    hybrid = "dp_shard" in names
    with warnings.catch_warnings():
        # torch 2.13 warns that slicing a flattened dim from the root mesh (HSDP's 2-D mesh) will change
        warnings.simplefilter("ignore", UserWarning)
        if hybrid:
            dp = root["dp_replicate", "dp_shard"]._flatten("dp")
            root["dp_shard", "cp"]._flatten("dp_shard_cp")
            grad = root["dp_replicate", "dp_shard_cp"]
        else:
            dp = root["dp"]
            grad = root["dp", "cp"]._flatten("dp_cp")
    return Meshes(
        root=root, dp=dp, pp=root["pp"], tp=root["tp"], cp=root["cp"], grad=grad, hybrid=hybrid
    )


def stage_block_counts(config: ParallelConfig, blocks: int) -> list[int]:
    """Blocks per pipeline stage (pp * virtual_stages of them): the plan's split, or as even as
    possible with the extra blocks on the leading stages."""
    if config.stages:
        return list(config.stages)
    chunks = config.pp * config.virtual_stages
    base, extra = divmod(blocks, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def stage_ids(config: ParallelConfig, pp_rank: int) -> list[int]:
    """Stages held by pipeline rank r: [r] for single-stage schedules, [r, r+pp, ...] for looped ones
    (interleaved 1F1B, Narayanan et al. 2021 sec. 2.2; interleaved zero bubble, Qi et al. 2024)."""
    if config.schedule in LOOPED_SCHEDULES:
        return [pp_rank + k * config.pp for k in range(config.virtual_stages)]
    return [pp_rank]


def build_stage_module(model: nn.Module, counts: list[int], stage: int) -> nn.Module:
    """A Transformer holding only stage `stage`'s blocks (names unchanged, others absent: the
    embeddings on the first stage, final norm and output head on the last). The modules are
    `model`'s own, not copies (a 124M-parameter model copied once per stage doubled each rank's
    memory): the caller hands every stage its disjoint share and drops `model`."""
    start = sum(counts[:stage])
    keep = [str(i) for i in range(start, start + counts[stage])]
    part = type(model).__new__(type(model))
    nn.Module.__init__(part)
    part.spec = model.spec
    part._rope_len = getattr(model, "_rope_len", 0)
    first, last = stage == 0, stage == len(counts) - 1
    part.tok_embeddings = model.tok_embeddings if first else None
    part.pos_embeddings = model.pos_embeddings if first else None
    part.layers = nn.ModuleDict({k: model.layers[k] for k in keep})
    part.norm = model.norm if last else None
    part.output = model.output if last else None
    return part


def apply_tp(
    module: nn.Module, tp_mesh, *, sequence_parallel: bool, bug: str | None = None
) -> None:
    """Megatron tensor parallelism on one (stage) module, by module name.

    wq/wk/wv and w1/w3 column-parallel, wo and w2 row-parallel; embedding row-parallel (vocab
    split), output head column-parallel with replicated logits. With sequence parallelism the norms
    run on sequence shards (Shard(1)) between blocks; each stage takes and hands on the full
    sequence (the first block scatters it, a non-final stage's last block gathers it), so rotary
    tables and learned positions always see the whole sequence.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    rowwise = _unreduced_rowwise() if bug == "tp_no_reduce" else RowwiseParallel
    top: dict = {}
    if module.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        )
    if module.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if module.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(),
            output_layouts=Replicate(),
            use_local_output=True,
        )
    if top:
        parallelize_module(module, tp_mesh, top)
    keys = list(module.layers.keys())
    between = Shard(1) if sp else Replicate()
    for i, key in enumerate(keys):
        block = module.layers[key]
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": rowwise(output_layouts=between),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": rowwise(output_layouts=between),
        }
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["attention"] = PrepareModuleInput(
                input_layouts=(Shard(1), None),
                desired_input_layouts=(Replicate(), None),
                use_local_output=True,
            )
            plan["ffn_norm"] = SequenceParallel()
            plan["feed_forward"] = PrepareModuleInput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_output=True,
            )
        parallelize_module(block, tp_mesh, plan)
        if sp and i == 0:
            parallelize_module(
                block,
                tp_mesh,
                PrepareModuleInput(
                    input_layouts=(Replicate(), None),
                    desired_input_layouts=(Shard(1), None),
                    use_local_output=True,
                ),
            )
        if sp and i == len(keys) - 1 and module.norm is None:
            parallelize_module(
                block,
                tp_mesh,
                PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate()),
            )
        if bug == "tp_double_reduce":
            for linear in (block.attention.wo, block.feed_forward.w2):
                linear.register_forward_hook(partial(_reduce_again, group=tp_mesh.get_group()))


def _reduce_again(module, inputs, output, *, group):
    """Planted bug tp_double_reduce: all-reduce an already reduced RowwiseParallel output."""
    import torch.distributed.nn.functional as dist_fn

    return dist_fn.all_reduce(output, group=group)


def _unreduced_rowwise():
    from torch.distributed.tensor.parallel import RowwiseParallel

    class UnreducedRowwise(RowwiseParallel):
        """Planted bug tp_no_reduce: the partial sums of a row-parallel product are used as the output."""

        @staticmethod
        def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
            return outputs.to_local()

    return UnreducedRowwise


def _attention_core_policy(ctx, func, *args, **kwargs):
    """Selective recomputation (Korthikanti et al. 2022, sec. 4.2): recompute the attention core
    (QK^T, softmax, attention-weighted values), keep every other activation."""
    from torch.utils.checkpoint import CheckpointPolicy

    name = str(func)
    if "scaled_dot_product" in name or "softmax" in name:
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def apply_ac(module: nn.Module, recompute: str, layers: int | None = None) -> None:
    """Activation checkpointing per block (non-reentrant): 'full' recomputes the whole block in
    backward, 'selective' only the attention core (selective checkpoint contexts). With `layers`
    (ParallelConfig.recompute_layers) only the first `layers` blocks of this stage module are wrapped,
    as Megatron-Core's 'block' method recomputes the first N layers of each pipeline chunk."""
    if recompute == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    kwargs = {"preserve_rng_state": False}
    if recompute == "selective":
        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _attention_core_policy)
    keys = list(module.layers.keys())
    for key in keys if layers is None else keys[:layers]:
        module.layers[key] = checkpoint_wrapper(module.layers[key], **kwargs)


def apply_fsdp(
    module: nn.Module,
    mesh,
    *,
    zero: int,
    offload_optimizer: bool = False,
    ignored: list[nn.Parameter] = (),
) -> nn.Module:
    """FSDP2 `fully_shard` per block and on the root over `mesh` (1-D: dp x cp; 2-D: HSDP, sharded
    over the inner dim and replicated over the outer): ZeRO-3 reshards parameters after forward,
    ZeRO-1/2 keep them gathered until backward (reshard_after_forward=False). `ignored`: parameters
    FSDP leaves alone (routed experts, reduced over their own group)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    policy = CPUOffloadPolicy() if offload_optimizer else OffloadPolicy()
    reshard = zero == 3
    skip = set(ignored) or None
    for block in module.layers.values():
        fully_shard(
            block,
            mesh=mesh,
            reshard_after_forward=reshard,
            offload_policy=policy,
            ignored_params=skip,
        )
    fully_shard(
        module, mesh=mesh, reshard_after_forward=reshard, offload_policy=policy, ignored_params=skip
    )
    return module


def apply_ddp(module: nn.Module, mesh, *, device: torch.device) -> nn.Module:
    """DistributedDataParallel over the gradient group (dp x cp; ZeRO 0, no tensor parallelism)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, process_group=mesh.get_group(), device_ids=ids)


class GradAllReduce:
    """Gradient reduction where DDP / FSDP do not apply: tensor-parallel DTensor parameters and pipeline
    stages under ZeRO-0 (DDP takes no DTensors, and several micro-batch backwards trip its bucket
    rebuild in torch 2.13), and routed experts (reduced over their expert data-parallel group). After
    the step's backward, every gradient's local shard is summed over `group` and divided by
    `divide_by` (what DDP's reducer does when divide_by is the group's size; without bucketing/overlap)."""

    def __init__(self, params: list[nn.Parameter], group, *, divide_by: int):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.divide_by = divide_by

    def __call__(self) -> None:
        from torch.distributed.tensor import DTensor

        for p in self.params:
            if p.grad is None:
                continue
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            if self.group is not None and dist.get_world_size(self.group) > 1:
                dist.all_reduce(local, group=self.group)
            if self.divide_by != 1:
                local.div_(self.divide_by)


def build_schedule(config: ParallelConfig, stages: list, loss_fn, *, lockstep: bool = False):
    """The plan's schedule from torch.distributed.pipelining: gpipe -> ScheduleGPipe (Huang et al.
    2019), 1f1b -> Schedule1F1B (Narayanan et al. 2021), interleaved-1f1b -> ScheduleInterleaved1F1B,
    zero-bubble -> ScheduleInterleavedZeroBubble (Qi et al. 2024). `lockstep` (the CPU/gloo path):
    a looped schedule runs its communication in lockstep (`lockstep_schedule`)."""
    from torch.distributed.pipelining import schedules

    classes = {
        "gpipe": schedules.ScheduleGPipe,
        "1f1b": schedules.Schedule1F1B,
        "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
        "zero-bubble": schedules.ScheduleInterleavedZeroBubble,
    }
    cls = classes[config.schedule]
    if config.schedule in LOOPED_SCHEDULES:
        if lockstep:
            return lockstep_schedule(cls)(
                stages, n_microbatches=config.num_microbatches, loss_fn=loss_fn, scale_grads=False
            )
        return cls(stages, n_microbatches=config.num_microbatches, loss_fn=loss_fn)
    return cls(stages[0], n_microbatches=config.num_microbatches, loss_fn=loss_fn)


def lockstep_schedule(cls):
    """`cls` (a looped schedule of torch.distributed.pipelining) run in lockstep: at each time step
    of its order, the computation, then every send and receive of that step batched and waited
    before the next one starts (PipelineScheduleMulti's own step loop); FSDP stages unshard in
    their forward hooks, synchronously; after the last step every stage reduces its gradients
    (FSDP's reduce-scatter) and divides them by the micro-batch count (`perform_reduce_grad`, the
    runtime's REDUCE_GRAD action). Built with scale_grads=False, so the division happens once, there.

    Why (issue 31): torch's runtime for looped schedules keeps the pipeline's isend/irecv and the
    stages' asynchronous FSDP all-gathers outstanding while the rank computes and runs the tensor-
    and data-parallel groups' collectives. On gloo each outstanding operation progresses on native
    threads of its own process group, beside the main thread's; the 8-rank dp2 x tp2 x pp2 ZeRO-3
    interleaved gpt2 run lost a rank to SIGSEGV under CPU load (and other layouts to SIGSEGV/SIGABRT
    in wait_tensor). In lockstep no operation of one group is in flight while another group's runs
    or the rank computes. Throughput is not what a CPU run measures; a GPU (nccl) run keeps the
    overlapping runtime."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    class Lockstep(cls):
        def _step_microbatches(self, *args, **kwargs):
            PipelineScheduleMulti._step_microbatches(self, *args, **kwargs)
            for stage in self._stages:
                stage.perform_reduce_grad(self._n_microbatches)

    Lockstep.__name__ = Lockstep.__qualname__ = f"Lockstep{cls.__name__}"
    return Lockstep
