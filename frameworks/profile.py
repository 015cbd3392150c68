"""The framework profile record (what a software stack does and can run, as the cost models and the
search read it) and the vocabularies its files use; frameworks/loader.py fills it from
frameworks/<name>.json and validates every key."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Mapping

from planner.data_schema import Field, reference_table
from planner.errors import ConfigError
from planner.parallel import CP_COMMS, OFFLOAD, PRECISIONS, RECOMPUTE, SCHEDULES, check_placement

KERNELS = ("fused", "eager", "torch")
"""Block implementations of cost_models.blocks: fused (Megatron / Transformer Engine kernels), eager
(Hugging Face modules in PyTorch eager), torch (plain PyTorch modules as torchtitan and this project's
executor write them)."""
ATTENTION_KERNELS = ("fused", "flash", "flash1", "sdpa", "triton", "unfused")
"""By generation: fused: cuDNN / FlashAttention-3-class fused attention (Shah et al. 2024;
Transformer Engine's DotProductAttention on Hopper and newer); flash: FlashAttention-2 (Dao 2023;
flash-attn 2.x, Megatron-DeepSpeed --use-flash-attn-v2); flash1: FlashAttention-1 (Dao et al.
2022; flash-attn 0.x-1.x, Megatron-LM and Megatron-DeepSpeed --use-flash-attn of 2023, PyTorch
2.0-2.1's SDPA flash kernel); sdpa: torch.nn.functional.scaled_dot_product_attention, which picks
FlashAttention-2 for 16-bit inputs and the memory-efficient or the math kernel for fp32
(cost_models.step.attention_kernel); triton: the 2022-23 Triton FlashAttention
(flash_attn_triton, llm-foundry's attn_impl 'triton'); unfused: materialized scores (Megatron-LM
2021-22, Hugging Face attn_implementation 'eager')."""
LOSS_KERNELS = ("vocab_parallel", "upcast", "fused", "native", "inplace")
"""How the cross-entropy is computed (cost_models.blocks.head_table): vocab_parallel: Megatron's
vocab-parallel cross-entropy on fp32 logits; upcast: torch's cross_entropy on logits cast to fp32
(Hugging Face's loss, torchtitan); fused: a fused kernel on the 16-bit logits (flash-attn's xentropy as
llm-foundry's default `fused_crossentropy`, Liger, Transformer Engine's cross-entropy); native: torch's
cross_entropy on the 16-bit logits, not upcast (NeMo AutoModel's MaskedCrossEntropy(fp32_upcast=False), the
setting of its benchmark configs); inplace: Transformer Engine's parallel cross-entropy, which writes the gradient
into the 16-bit logits during the forward (Megatron-Core's cross_entropy_fusion_impl "te", the setting of
Megatron-Bridge's performance recipes)."""
FP8_SCALINGS = ("tensorwise", "rowwise", "delayed", "mxfp8", "nvfp4")
"""FP8 scaling recipes the cost model tells apart: per tensor from the current amax (Transformer
Engine's current scaling, Megatron-LM's --fp8-recipe tensorwise, torchao's tensorwise), per row
(torchao's rowwise), per tensor from an amax history (Transformer Engine's DelayedScaling,
Megatron-LM's --fp8-recipe delayed), whose amaxes are all-reduced after each forward and backward of
an fp8_autocast region (cost_models.comm.fp8_amax_reduction_seconds), and MXFP8 (OCP MX: one
power-of-two E8M0 scale per 32 elements, in both orientations; Transformer Engine's
MXFP8BlockScaling, Megatron-LM's --fp8-recipe mxfp8), which needs block-scaled tensor cores (a
profile's peak_tflops.mxfp8: Blackwell), and NVFP4 (Transformer Engine's NVFP4BlockScaling under the
same autocast, TE >= 2.8; Megatron-LM's --fp4-format e2m1 --fp4-recipe nvfp4): the linear GEMMs'
fprop, dgrad and wgrad in FP4 E2M1 with an E4M3 scale per 16 elements and an fp32 scale per
tensor, on FP4 tensor cores (peak_tflops.nvfp4: Blackwell); attention, the output layer and
everything between the GEMMs stay in 16 bits. DeepSeek's 1x128 blocks are costed as tensorwise."""
MOE_DISPATCHERS = ("alltoall", "deepep")
"""How routed tokens reach experts on other ranks (cost_models.moe.exchange_seconds): alltoall (one NCCL
all-to-all over the expert-parallel group: Megatron-Core's alltoall dispatcher, torchtitan, DeepSpeed-MoE)
or deepep (DeepEP's hierarchical normal kernels: one network copy per destination node, NVLink forwarding
inside it; Megatron-Core's flex dispatcher, DeepSeek's own kernels)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StateBytes:
    """Bytes per parameter a stack keeps for one precision (Rajbhandari et al. 2020, Sec. 3.1)."""

    param: float
    """The model's parameters as the forward uses them (2 for bf16/fp16 copies, 4 for fp32)."""
    grad: float
    """Gradients (4 for fp32 main gradients, 2 for bf16)."""
    master: float
    """fp32 master copy of the parameters beside `param` (0 when `param` is itself the fp32 copy)."""
    state: float
    """One optimizer state (AdamW keeps two: exp_avg, exp_avg_sq; SGD with momentum one)."""
    reduce: float
    """Bytes per element of the data-parallel gradient reduction (reduce_dtype)."""
    gather: float
    """Bytes per element of ZeRO-3/FSDP parameter all-gathers (param_dtype)."""


def _placements_ok(placements) -> bool:
    try:
        for placement in placements:
            check_placement(placement)
    except ConfigError:
        return False
    return True


def capability(
    default=MISSING, *, means: str, vocab=None, check=None, allowed: str = "", lacking: str = ""
):
    """One key of a profile's `capabilities` block, declared once: the field's annotation is its JSON
    type (a tuple is a JSON list), `default` makes it optional, `vocab` lists the values it (or each of
    its items) may take, `check` is any further rule (`allowed` says it in words), `means` documents
    it. A switch a stack may lack says in `lacking` what a stack without it does instead: the run
    option of the same name is then refused there with that reason (planner.software.
    check_switches). frameworks/loader.py validates every key from these declarations and
    `capability_reference` renders them for docs/framework-profiles.md."""
    metadata = {"means": means, "vocab": vocab, "check": check, "allowed": allowed}
    metadata["lacking"] = lacking
    if default is MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, kw_only=True, slots=True)
class Capabilities:
    """What the stack can run (the search only proposes these; estimate refuses the rest by name).
    Keys without a default are required in every profile; the others take the default shown."""

    precisions: tuple[str, ...] = capability(means="Precisions it trains in.", vocab=PRECISIONS)
    schedules: tuple[str, ...] = capability(
        means="Pipeline schedules; empty means no pipeline parallelism (pp must be 1).",
        vocab=SCHEDULES,
    )
    max_virtual_stages: int = capability(
        means="Most virtual pipeline stages per rank (interleaved schedules).",
        check=lambda v: 1 <= v <= 64,
        allowed="1 to 64",
    )
    zero: tuple[int, ...] = capability(means="ZeRO stages it shards with.", vocab=ZERO_STAGES)
    zero_with_pp: tuple[int, ...] = capability(
        means="ZeRO stages allowed together with pp > 1.", vocab=ZERO_STAGES
    )
    tp: bool = capability(means="Whether it runs tensor parallelism.")
    sequence_parallel: str = capability(
        means="Tensor-parallel sequence parallelism: 'optional', 'always' (with tp > 1) or 'never'.",
        vocab=("optional", "always", "never"),
    )
    cp_comm: tuple[str, ...] = capability(
        means="Context-parallel KV exchanges it implements; empty means no context parallelism.",
        vocab=CP_COMMS,
    )
    ep: bool = capability(means="Whether it runs expert parallelism.")
    expert_tp: bool = capability(
        means="Whether experts take a tensor-parallel degree of their own (expert_tp)."
    )
    hsdp: bool = capability(means="Shard groups smaller than dp (dp_shard).")
    offload: tuple[str, ...] = capability(means="What it offloads to the host.", vocab=OFFLOAD)
    recompute: tuple[str, ...] = capability(means="Recomputation modes.", vocab=RECOMPUTE)
    placements: tuple[str, ...] = capability(
        means="Rank orders the stack builds (D, P, T; C and E inserted where used); empty means any.",
        check=_placements_ok,
        allowed="placement strings over D, P, T (C, E optional)",
    )
    activation_offload: str = capability(
        "any",
        means=(
            "'any', or 'without_pp_or_recompute' where activation offload excludes pipelining and "
            "recomputation (Megatron-Core's cpu_offloading asserts both)."
        ),
        vocab=("any", "without_pp_or_recompute"),
    )
    cp_with_sequence_parallel: bool = capability(
        True,
        means=(
            "Whether context parallelism combines with tensor-parallel sequence parallelism "
            "(Megatron-DeepSpeed refuses DeepSpeed-Ulysses together with --sequence-parallel)."
        ),
    )
    master_remainders: bool = capability(
        False,
        means=(
            "Whether the optimizer can keep the fp32 master weights as the 16 low bits beside bf16 "
            "parameters (Apex DistributedFusedAdam / Transformer Engine FusedAdam "
            "store_param_remainders; MASTER_WEIGHTS)."
        ),
    )
    moe_model_types: tuple[str, ...] | None = capability(
        None,
        means=(
            "Mixture-of-experts architectures (Hugging Face model_type) the stack builds; None: any "
            "(Megatron-Core, DeepSpeed-MoE and Hugging Face modules take the shape from arguments "
            "or the config)."
        ),
        check=lambda v: v is None or all(isinstance(t, str) and t for t in v),
        allowed="a list of model_type names or null",
    )
    mtp_with_pp_or_cp: bool = capability(
        True,
        means=(
            "Whether multi-token-prediction modules (DeepSeek-V3's MTP, "
            "TransformerSpec.mtp_modules) run with pipeline or context parallelism (torchtitan "
            "0.3.0's MTPDecoder refuses both)."
        ),
    )
    activation_fp8_input: bool = capability(
        False,
        means=(
            "Whether the stack can store the SwiGLU activation's input in FP8 for the backward "
            "(Megatron-Core's activation_func_fp8_input_store; "
            "cost_models.step.Software.activation_fp8_input)."
        ),
    )
    bf16_optimizer: bool = capability(
        False,
        means=(
            "Whether the stack has DeepSpeed's BF16_Optimizer (bf16 with ZeRO 0-1 and fp32 gradient "
            "accumulation; cost_models.step.Software.bf16_optimizer)."
        ),
        lacking="has no BF16_Optimizer",
    )
    optimizer_offload_min_zero: int = capability(
        0,
        means=(
            "Lowest ZeRO stage with which the stack offloads the optimizer (DeepSpeed's "
            "offload_optimizer needs ZeRO >= 1, FSDP's CPU offload a sharded model; Megatron turns "
            "its distributed optimizer on itself)."
        ),
        check=lambda v: v in ZERO_STAGES,
        allowed="a ZeRO stage 0-3",
    )
    recompute_layers: bool = capability(
        False,
        means=(
            "Whether full recomputation can re-run only some blocks of each pipeline chunk "
            "(ParallelConfig.recompute_layers: Megatron-Core's --recompute-method block "
            "--recompute-num-layers; torch's checkpoint_wrapper on chosen blocks)."
        ),
    )
    attention_kernels: tuple[str, ...] = capability(
        ATTENTION_KERNELS,
        means=(
            "Attention kernel families the stack can run (ATTENTION_KERNELS; the run option "
            "`attention`, the framework's default and a model config's choice are refused "
            "outside it): every family unless the profile lists fewer."
        ),
        vocab=ATTENTION_KERNELS,
    )
    fp8_scalings: tuple[str, ...] = capability(
        ("tensorwise",),
        means=(
            "FP8 scaling recipes the stack runs (FP8_SCALINGS; the run option `fp8_scaling` and "
            "the framework's default are refused outside it): Megatron-LM's --fp8-recipe, "
            "torchao's float8 recipes, the delayed scaling Transformer Engine's autocast gets "
            "from Accelerate and Composer."
        ),
        vocab=FP8_SCALINGS,
    )
    moe_dispatchers: tuple[str, ...] = capability(
        ("alltoall",),
        means=(
            "Token dispatchers the stack runs with expert parallelism (MOE_DISPATCHERS): every "
            "stack has an all-to-all one; DeepEP where the stack integrates it (Megatron-Core's "
            "flex dispatcher, torchtitan's DeepEPTokenDispatcher)."
        ),
        vocab=MOE_DISPATCHERS,
        check=lambda v: "alltoall" in v,
        allowed="a list that includes alltoall",
    )
    moe_a2a_overlap: bool = capability(
        False,
        means=(
            "Whether the stack can hide the expert-parallel dispatch and combine under other "
            "micro-batches' computation (Megatron-Core's --overlap-moe-expert-parallel-comm, on the "
            "plans frameworks.rules.a2a_overlap_conflict allows; cost_models.moe)."
        ),
    )
    moe_fp8_dispatch: bool = capability(
        False,
        means=(
            "Whether the stack can dispatch tokens to the experts in FP8 (DeepSeek-V3's own "
            "kernels; none of the four stacks exposes it)."
        ),
    )
    uneven_stages: bool = capability(
        True,
        means=(
            "Whether the search may propose an uneven split of the blocks over the pipeline stages "
            "(ParallelConfig.stages); false where the exported job places blocks only by an even "
            "split (DeepSpeed 0.19.8's PipelineModule partitions by its `partition_method`, whose "
            "'type:<block class>' split is the even one: planner.partition.even_split). estimate "
            "still costs any split given (published runs used other partitioners); export refuses "
            "what the target cannot place (planner.exports.limits)."
        ),
    )
    cuda_graphs: bool = capability(
        False,
        means=(
            "Whether the stack can capture each block's forward and backward as CUDA graphs, one "
            "launch per pass on the host (Megatron-Core's --enable-cuda-graph / cuda_graph_impl "
            "'local', megatron/core/transformer/cuda_graphs.py; cost_models.host)."
        ),
        lacking="has no per-layer CUDA graph capture",
    )
    fp8_param_gather: bool = capability(
        False,
        means=(
            "Whether the stack can all-gather the GEMM weights in FP8 under an FP8 recipe "
            "(Megatron-Core's --fp8-param-gather; torchtitan's float8 enable_fsdp_float8_all_gather "
            "before 0.3.0; cost_models.step.Software.fp8_param_gather)."
        ),
        lacking="all-gathers its parameters in their 16-bit dtype",
    )
    tp_comm_overlap: bool = capability(
        False,
        means=(
            "Whether the stack can overlap tensor-parallel collectives with the GEMMs "
            "(Megatron-Core's userbuffers, torchtitan's async TP; "
            "cost_models.comm.tp_exposed_seconds)."
        ),
        lacking="runs its tensor-parallel collectives after their GEMMs",
    )
    recompute_modules: bool = capability(
        False,
        means=(
            "Whether selective recomputation can name the modules it re-runs (Megatron-Core's "
            "--recompute-modules: core_attn, layernorm, mlp, moe, moe_act, shared_experts, "
            "mla_up_proj; cost_models.blocks.module_sac)."
        ),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkProfile:
    """One software stack (see the module docstring)."""

    name: str
    description: str
    kernels: str
    """Block implementation (KERNELS)."""
    attention: str
    """Default attention kernel (ATTENTION_KERNELS); a model's config may override it."""
    loss: str
    """Default cross-entropy implementation (LOSS_KERNELS); a run may override it."""
    state_bytes: Mapping[str, StateBytes]
    """By precision."""
    grads_persist: str
    """'always' (a contiguous gradient buffer, Megatron) or 'accumulating' (freed by zero_grad unless
    micro-batches accumulate into them)."""
    grad_bucket_copy: bool
    """PyTorch DDP copies gradients into its buckets (gradient_as_bucket_view=False): a second copy."""
    autocast_weight_cache: bool
    """torch.autocast keeps a 16-bit copy of every GEMM weight during the forward."""
    overlap_grad_reduce: bool
    """The data-parallel reduction runs bucket by bucket during the last backward."""
    pp_scatter_gather: bool
    """Pipeline sends carry 1/tp of the activation and all-gather it inside the node (Megatron)."""
    zero_bubble_forward_reruns: float
    """Forward passes per micro-batch of a fully recomputed block under zero-bubble schedules (2 means
    the usual forward plus one recompute)."""
    allocator_overhead_fraction: float
    """Caching-allocator blocks beyond the tensors they hold (reserved / allocated - 1)."""
    expandable_segments: bool
    """The stack's launcher sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (a run may say otherwise):
    the allocator maps physical pages into one growing segment per stream, so free space between tensors
    serves requests of any size and costs no allocator overhead (cost_models.memory.allocator_overhead)."""
    compute_efficiency: float
    """Fraction of the cost model's kernel rates the stack's blocks reach (launch gaps, synchronizations,
    copies its kernels add around the GEMMs, attention and memory-bound work of cost_models.blocks):
    fitted to the stack's published runs (benchmarks/calibrate_frameworks.py, leave one source out);
    Megatron, whose runs calibrated the kernel rates, is the reference (1)."""
    selective_recompute: str
    """What `recompute=selective` means on this stack: 'attention' (Megatron: the attention core) or 'op'
    (torchtitan: per-operator, cost_models.blocks.OpSac)."""
    tp_comm_overlap: bool
    """Tensor-parallel collectives overlapped with the GEMMs they feed (Megatron-Core's tp_comm_overlap
    through Transformer Engine's userbuffers, torch's async TP): the default; a run may say otherwise."""
    fp8_cast_bytes_per_element: float
    """Memory traffic per element of a GEMM operand to run it in FP8 (cost_models.compute.fp8_cast_bytes)."""
    fp8_weight_cache_bytes: float
    """Bytes per GEMM weight the FP8 recipe keeps beside the 16-bit weights for the whole step (Transformer
    Engine's row- and column-major FP8 copies: 2; torchao casts on the fly: 0)."""
    capabilities: Capabilities
    sources: Mapping[str, str] = field(default_factory=dict)
    moe_dispatcher: str = "alltoall"
    """The stack's default token dispatcher for expert parallelism (MOE_DISPATCHERS)."""
    fp8_scaling: str = "tensorwise"
    """The stack's default FP8 scaling recipe (FP8_SCALINGS; cost_models.step.Software.
    fp8_scaling)."""
    moe_a2a_overlap: bool = False
    """Expert-parallel exchanges overlap another micro-batch's compute by default (cost_models.moe)."""
    overlap_param_gather: bool = False
    """The distributed optimizer's (ZeRO 1-2) parameter all-gather runs bucket by bucket under the
    next step's forward instead of after the optimizer step (Megatron-Core --overlap-param-gather;
    FSDP's forward gathers with prefetch); needs overlap_grad_reduce (cost_models.timeline)."""
    overlap_p2p: bool = False
    """Pipeline sends and receives of the interleaved schedule run beside the next chunk's compute
    instead of blocking it (Megatron-Core's overlap_p2p_comm, on unless
    --no-overlap-p2p-communication; interleaved only): cost_models.timeline."""
    megatron_legacy_layer: bool = False
    """The stack's dense block is legacy Megatron-LM's ParallelTransformerLayer
    (megatron/model/transformer.py, which Megatron-DeepSpeed runs): eager module code around
    Megatron's fused kernels, whose host issues operators as eager module code does
    (cost_models.blocks.legacy_megatron_launches) rather than the fused table's count."""
    pipeline_host_sync: bool = False
    """The host waits for the device before every pipeline operation (cost_models.host.host_synced):
    Megatron-LM's batched p2p calls torch.cuda.synchronize() (batch_p2p_sync), DeepSpeed's
    PipelineEngine reads each received activation's metadata on the host; torch.distributed.pipelining
    waits on its p2p work on the stream only (torchtitan)."""
    fp8_param_gather: bool = False
    """Under an FP8 recipe with ZeRO >= 1, the GEMM weights are FP8 parameters gathered in FP8 by
    default (cost_models.step.Software.fp8_param_gather): every NeMo 2.0 and Megatron-Bridge FP8
    recipe sets it; a run may say otherwise. Not under nvfp4, whose Megatron-Bridge recipe keeps
    bf16 parameters (cost_models.step.Software.of)."""
    fp8_tp_gather: tuple[str, ...] = ()
    """The FP8 recipes under which the sequence-parallel all-gathers of the linear layers carry the
    recipe's quantized tensors, not 16-bit ones (cost_models.comm.tp_pair_seconds): Transformer
    Engine quantizes the norm output before the column-parallel all-gather and the output gradient
    before the row-parallel one under every recipe; torchao's float8 tensor-parallel styles do so
    for tensorwise scaling. The reduce-scatters stay 16-bit."""
    cuda_graphs: bool = False
    """Blocks captured as CUDA graphs by default (cost_models.host.block_host_parts): off in every
    shipped stack (Megatron-LM's --enable-cuda-graph is off unless asked)."""
    tp_backward_async: bool = False
    """A column-parallel linear layer keeps only its input's sequence-parallel shard and re-gathers
    it in the backward, and runs its backward's tensor-parallel collectives beside its own GEMMs:
    without tp_comm_overlap asynchronously (the all-reduce of the input gradient beside the
    weight-gradient GEMM, or under sequence parallelism the re-gather beside the data-gradient GEMM
    and the reduce-scatter of the input gradient beside the weight-gradient one), with it in
    userbuffers' bulk overlaps (cost_models.comm.tp_exposed_parts)."""
    moe_host_sync: bool = False
    """A dropless MoE layer's forward waits on the host for the tokens per expert (cost_models.moe.
    host_sync_seconds): Transformer Engine's GroupedLinear takes its splits as a host list."""
    moe_host_ops_per_layer: float = 0.0
    """Host operators an MoE layer's forward issues beyond the block table's kernel count (router,
    permutation bookkeeping, per-expert GEMMs and casts, dispatcher metadata): cost_models.moe.host_sync_seconds."""
    experts_follow_tp_without_ep: bool = False
    """Without expert parallelism (ep = 1) the routed experts are sharded over the tensor-parallel ranks, as
    expert_tp = tp (torchtitan 0.3.0 places them on the dense TP axis); the plan's expert_tp stays 1, the stack
    having no degree of its own for it (cost_models.step.Step.of)."""
    shard_per_block: bool = False
    """Sharded data parallelism (ZeRO 2-3) all-gathers and reduce-scatters each wrapped transformer
    block's parameters in collectives of their own with the step waiting on their ring latency
    (PyTorch FSDP1: one FlatParameter per wrapped unit, its rate limiter holding the host to two
    gathers in flight): cost_models.comm.shard_unit_latency_seconds. False: bucketed collectives
    (Megatron-Core's distributed optimizer, DeepSpeed's reduce buckets), or per-block ones whose
    latency the published runs do not show (torchtitan's FSDP2: its multi-node rows are already
    predicted slow without it)."""
    grad_bucket_params: tuple[float, float] | None = None
    """Gradient bucket size in parameters as (floor, per data-parallel rank): a bucket holds
    max(floor, per_rank x dp) parameters (Megatron-Core's DistributedDataParallel default is
    max(40M, 1M x dp), NVIDIA's NeMo 2.0 / Megatron-Bridge recipes fix 128 Mi parameters, per_rank
    0). None: PyTorch DDP's 25 MiB buckets (cost_models.comm.gradient_buckets)."""
    zero3_max_live_params: float | None = None
    """How ZeRO-3 gathers parameters. None: by wrapped unit, one transformer block at a time with the next one
    prefetched (FSDP's fully_shard per block). A number: by submodule (DeepSpeed's PartitionedParameterCoordinator
    gathers each module's own parameters in its forward/backward hook and keeps or prefetches others only up to
    stage3_max_live_parameters), so at most this many parameters, or the largest module when that is bigger, are
    gathered at once (cost_models.memory.zero3_live_params)."""

    def states(
        self,
        precision: str,
        optimizer: str,
        grad_bytes: float | None = None,
        master_bytes: float | None = None,
    ) -> tuple[float, float, float]:
        """(params, grads, optimizer) bytes per parameter: optimizer = master + states, two states for
        AdamW and one for SGD with momentum (cost_models.memory.state_bytes_per_param); `grad_bytes`
        overrides the gradient dtype (a run's grad_reduce_dtype), `master_bytes` the master copy (a run's
        master_weights)."""
        s = self.state_bytes[precision]
        n_states = 2.0 if optimizer == "adamw" else 1.0
        master = s.master if master_bytes is None else master_bytes
        return s.param, s.grad if grad_bytes is None else grad_bytes, master + n_states * s.state


def _capability_field(declared) -> Field:
    """One `capability(...)` declaration as a planner.data_schema Field (its annotation is its
    JSON type: a tuple is a list, '| None' nullable; no default: required)."""
    rule = declared.metadata
    kind = declared.type.removesuffix(" | None")
    items = ""
    if kind.startswith("tuple["):
        kind, items = "list", kind.removeprefix("tuple[").split(",")[0]
    required = declared.default is MISSING
    return Field(
        kind=kind,
        items=items,
        nullable=declared.type.endswith(" | None"),
        required=required,
        default=None if required else declared.default,
        allowed=tuple(rule["vocab"] or ()),
        rule=rule["allowed"],
        doc=rule["means"],
    )


SWITCHES_A_STACK_MAY_LACK: dict[str, str] = {
    declared.name: declared.metadata["lacking"]
    for declared in fields(Capabilities)
    if declared.metadata["lacking"]
}
"""Run options that are switches a stack runs only where its capability of the same name says
so, with what a stack without it does instead (`capability`'s `lacking`): planner.software
refuses them there, frameworks/loader.py refuses a profile that defaults one on."""


CAPABILITY_FIELDS = {
    declared.name: _capability_field(declared) for declared in fields(Capabilities)
}
"""The `capabilities` block as planner.data_schema Fields: frameworks/loader.py validates with them,
capability_reference and docs/data-files.md render them."""


def capability_reference() -> str:
    """The `capabilities` keys as a Markdown table, rendered from their declarations
    (docs/framework-profiles.md holds it; tests/test_frameworks.py keeps the two equal)."""
    return reference_table(CAPABILITY_FIELDS)
