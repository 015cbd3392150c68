"""The record every cost term reads: one batch of candidate configurations, resolved once.

`Step.of(...)` turns the candidate arrays (planner.score.CandidateArrays) and the run's software
(`Software`: the framework profile plus the model's attention kernel and dropout) into plain float
arrays and the per-token tables of the block implementation; the terms in cost_models (compute,
comm, pipeline, memory, offload) are pure functions of it. Arrays broadcast over candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Mapping

import numpy as np

from cost_models import blocks as B
from cost_models.activations import block_table_of, selective_policy
from cost_models.compute import linear_gemm_precision
from cost_models.moe import DEFAULT_IMBALANCE
from frameworks import FrameworkProfile
from frameworks.rules import a2a_overlap_runs
from hardware_profiles import HardwareProfile
from planner.errors import ConfigError
from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES, offload_indices
from planner.placement import distinct_rows, group_locality
from planner.run_options import GRAD_REDUCE_BYTES, RunOptions
from planner.spec import TransformerSpec


MASTER_WEIGHTS = ("fp32", "remainder")
"""How the optimizer keeps the master copy of 16-bit parameters (Software.master_weights)."""

BF16_PARAM_PRECISIONS = ("amp-bf16", "bf16", "fp8")
"""Precisions whose model parameters are bf16 (FP8 recipes keep bf16 weights beside their FP8 casts): the
ones a 16-bit master remainder works with, and the ones Megatron runs with --bf16."""


_OFFLOADS = {
    kind: np.isin(np.arange(len(OFFLOAD)), offload_indices(kind))
    for kind in ("optimizer", "activations")
}
"""Per offload kind, a table over OFFLOAD indices: whether that value moves `kind` to the host (Step.is_offload)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Software:
    """What the training software does, for one run: the stack and the model's kernel choices."""

    framework: FrameworkProfile
    attention: str
    """Attention kernel family: fused, flash, flash1, sdpa, triton or unfused
    (frameworks.ATTENTION_KERNELS)."""
    dropout: bool = False
    """Dropout layers active (masks saved, extra kernels)."""
    overlap_grad_reduce: bool
    """Data-parallel reduction overlapped with the backward (the framework's default unless a run
    says otherwise, e.g. Megatron-LM 2021-22's local DDP)."""
    overlap_param_gather: bool = False
    """The distributed optimizer's parameter all-gather runs under the next step's forward
    (Megatron-Core --overlap-param-gather, FSDP's forward prefetch): the framework's default unless
    a run says otherwise (cost_models.timeline)."""
    overlap_p2p: bool = False
    """The interleaved schedule's pipeline sends run beside compute (Megatron-Core
    overlap_p2p_comm): the framework's default unless a run says otherwise
    (cost_models.timeline)."""
    loss: str = "upcast"
    """Cross-entropy implementation (frameworks.LOSS_KERNELS): the framework's unless a run says otherwise."""
    tp_comm_overlap: bool = False
    """Tensor-parallel collectives overlapped with the GEMMs (the framework's default unless a run says
    otherwise: NeMo's tp_comm_overlap, torchtitan's async TP)."""
    compile: bool = False
    """torch.compile on the blocks: Inductor fuses the memory-bound operator chains (norms, rotary
    embedding, activation, residual adds) as Megatron's hand-fused kernels do, so the block streams the
    fused table's bytes and launches its kernel count (Ansel et al. 2024, "PyTorch 2", Sec. 4-6);
    what autograd saves is left as the framework's table says."""
    grad_reduce_dtype: str | None = None
    """'bf16' or 'fp32': the dtype gradients are kept and reduced in, when a run sets it (NVIDIA's NeMo 1.x
    recipes with Apex's distributed fused Adam: bf16; Megatron-LM's default for bf16: fp32); None: the
    framework profile's state_bytes."""
    moe_dispatcher: str = "alltoall"
    """How tokens reach experts on other ranks (frameworks.MOE_DISPATCHERS): alltoall (NCCL) or deepep
    (hierarchical, node-deduplicated); the framework's default unless a run says (cost_models.moe)."""
    moe_a2a_overlap: bool = False
    """Expert-parallel exchanges run beside another micro-batch's compute (Megatron-Core
    --overlap-moe-expert-parallel-comm, DeepSeek DualPipe); the framework's default unless a run says."""
    moe_imbalance: float = DEFAULT_IMBALANCE
    """Busiest rank's routed tokens over the mean (>= 1); unset: cost_models.moe.DEFAULT_IMBALANCE."""
    moe_fp8_dispatch: bool = False
    """Tokens dispatched in FP8 under an FP8 recipe (DeepSeek-V3 Sec. 3.3.2, DeepEP); combine in 16 bits."""
    activation_offload_layers: int | None = None
    """With activation offload, how many blocks offload (Megatron-Core's cpu_offloading_num_layers: the first N
    blocks' saved tensors go to the host); None: every block (cost_models.offload.offloaded_share)."""
    master_weights: str = "fp32"
    """How the optimizer keeps the master copy of 16-bit parameters (MASTER_WEIGHTS): 'fp32' (4 bytes),
    or 'remainder': only the 16 low bits of each fp32 master value, the bf16 parameter being its 16 high
    bits (2 bytes; Apex DistributedFusedAdam and TE FusedAdam store_param_remainders, NeMo 1.x's default
    for bf16 models)."""
    fused_norm: bool = False
    """Eager blocks run each RMSNorm as one fused kernel (torchtitan's norm_type fused_rmsnorm; cost_models.blocks.
    _eager_block): less saved and streamed than the module's op-by-op upcast; stacks with fused kernels already do."""
    expandable_segments: bool = False
    """PyTorch's allocator runs with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): the
    framework launcher's default unless a run says otherwise (cost_models.memory.allocator_overhead)."""
    bf16_optimizer: bool = False
    """DeepSpeed's BF16_Optimizer (bf16 with ZeRO-1-like sharding of the optimizer states and fp32 gradient
    accumulation; a DeepSpeed config with ZeRO stage 0, or 1 with grad_accum_dtype fp32): every gradient is
    accumulated into an unsharded fp32 buffer after each micro-batch beside the bf16 gradients, all-reduced in
    bf16, and the updated bf16 parameters all-gathered from their owners (deepspeed/runtime/bf16_optimizer.py,
    pipe/engine.py _exec_backward_pass and _bf16_reduce_grads, v0.6.5)."""
    activation_fp8_input: bool = False
    """The fused SwiGLU keeps its input in FP8 for the backward (Megatron-Core's activation_func_fp8_input_store;
    DeepSeek-V3's report, Sec. 3.3.3, caches its MoE SwiGLU inputs the same way): cost_models.blocks.block_table."""
    recompute_modules: tuple[str, ...] | None = None
    """What selective recomputation re-runs on a stack whose selective policy is by module (Megatron-Core's
    recompute_modules, cost_models.blocks.RECOMPUTE_MODULES); None: the attention core (its default)."""
    cuda_graphs: bool = False
    """Each block's forward and backward captured as a CUDA graph (Megatron-Core's per-layer graphs,
    --enable-cuda-graph / cuda_graph_impl): one launch per pass on the host (cost_models.host)."""
    fp8_param_gather: bool = False
    """Under an FP8 recipe with ZeRO >= 1, the blocks' GEMM weights are all-gathered in FP8, one
    byte each (NVFP4's 0.5625 under nvfp4; Megatron-Core's --fp8-param-gather, which needs its
    distributed optimizer; the framework's default unless a run says otherwise; torchtitan's float8
    enable_fsdp_float8_all_gather before 0.3.0): cost_models.comm.dp_reduction_parts. A stack that keeps FP8
    copies of the weights for the step (fp8_weight_cache_bytes > 0: Transformer Engine) then holds
    each GEMM weight as an FP8 tensor instead of a 16-bit one beside its copies, one byte less for
    the parameter and one for the copies (TE's Float8Tensor parameters under fp8_model_init, the
    transpose still cached); a stack that casts on the fly keeps 16-bit shards and gathers FP8
    (cost_models.memory.rank_memory)."""
    train_metrics: int = 0
    """Cross-entropy metrics the trainer computes over each micro-batch's logits after its backward
    (Composer with llm-foundry's MPT and Hugging Face models: LanguageCrossEntropy and
    LanguagePerplexity, 2, unless use_train_metrics is off): memory-bound passes over the logits on
    the last stage (cost_models.blocks.metric_traffic)."""
    fp8_scaling: str = "tensorwise"
    """How an FP8 recipe scales GEMM operands (frameworks.profile.FP8_SCALINGS): one scale per
    tensor, per row (torchao's rowwise recipe), whose backward needs every operand scaled along its
    other axis too (cost_models.compute.fp8_cast_bytes), per tensor from an amax history (delayed:
    its amax all-reduces, comm.fp8_amax_reduction_seconds), per 32-element block (mxfp8), or FP4
    GEMMs with 16-element blocks (nvfp4)."""

    @classmethod
    def of(cls, framework: FrameworkProfile, options: RunOptions = RunOptions()) -> "Software":
        """The run's software: `options` (the user's choices) with `framework`'s defaults applied
        wherever the user left one unset; the one place those defaults are applied. An option's
        default is the framework profile's key of the same name where the profile has one
        (frameworks.FrameworkProfile: attention, loss, the overlaps, cuda_graphs, ...), else the
        field's default here. The framework's fp8_param_gather default is its FP8 recipes'; under
        nvfp4 the parameters stay bf16 unless the user asks (Megatron-Bridge's
        bf16_with_nvfp4_mixed sets fp8_param_gather False and no fp4_param,
        src/megatron/bridge/training/mixed_precision.py at v0.3.0)."""
        software = cls(
            framework=framework,
            **{
                f.name: _resolved(f, getattr(options, f.name), framework)
                for f in fields(cls)
                if f.name != "framework"
            },
        )
        if software.fp8_scaling == "nvfp4" and options.fp8_param_gather is None:
            software = replace(software, fp8_param_gather=False)
        return software

    def gathers_fp8(self, precision: str, zero=1):
        """Per ZeRO stage `zero` (an array over candidates), whether the GEMM weights are FP8
        parameters gathered in FP8: fp8_param_gather under an FP8 recipe, with parameters
        gathered at all (ZeRO >= 1: Megatron-LM asserts its distributed optimizer)."""
        return self.fp8_param_gather & (precision == "fp8") & (np.asarray(zero) >= 1)

    @property
    def imbalance(self) -> float:
        """The routed-token imbalance this run is costed with (moe_imbalance or the documented default)."""
        return float(self.moe_imbalance)

    def state_bytes(self, precision: str):
        """The framework's bytes per parameter for `precision` (frameworks.StateBytes) with the run's
        gradient dtype applied to the kept and the reduced gradients, and the master copy as 16-bit remainders
        when the run keeps it so (master_weights 'remainder': 2 bytes beside the 2-byte parameter, which
        together hold the fp32 value; planner.software.check_master_weights admits bf16 parameters only)."""
        from dataclasses import replace

        s = self.framework.state_bytes[precision]
        if self.master_weights == "remainder" and s.master > 0:
            s = replace(s, master=4.0 - s.param)
        if (
            self.bf16_optimizer
        ):  # the bf16 gradients plus their fp32 accumulation buffer; reduced in bf16
            return replace(s, grad=s.param + 4.0, reduce=s.param)
        if self.grad_reduce_dtype is None:
            return s
        b = GRAD_REDUCE_BYTES[self.grad_reduce_dtype]
        return replace(s, grad=b, reduce=b)

    def states(self, precision: str, optimizer: str) -> tuple[float, float, float]:
        """(params, grads, optimizer) bytes per parameter (cost_models.memory.state_bytes_per_param)."""
        s = self.state_bytes(precision)
        return self.framework.states(precision, optimizer, grad_bytes=s.grad, master_bytes=s.master)

    def kernel(self, precision: str, spec: TransformerSpec) -> str:
        """The attention kernel that actually runs (attention_kernel)."""
        return attention_kernel(self.attention, precision, spec)


def _resolved(option, chosen, framework: FrameworkProfile):
    """One Software field: the run's choice, or where it left it unset (None) the framework's
    default of the same name, else the field's own default; switches as bool."""
    value = getattr(framework, option.name, option.default) if chosen is None else chosen
    return bool(value) if option.type == "bool" else value


FLASH1_MAX_HEAD_DIM = 128
"""The widest head FlashAttention-1 compiles (flash-attn 1.0.x csrc/flash_attn/fmha_api.cpp,
run_fmha_fwd: templates for d <= 32, <= 64 and <= 128, and a refusal above)."""


def attention_kernel(attention: str, precision: str, spec: TransformerSpec) -> str:
    """'fused', 'flash', 'mem_efficient' or 'math' for a framework's attention family, a precision and a
    model. PyTorch SDPA (torch 2.5-2.10, aten/src/ATen/native/transformers/cuda/sdp_utils.cpp;
    validation/kernels/sdpa_dispatch.md): FlashAttention-2 for fp16/bf16 inputs; flash and cuDNN reject
    fp32, so fp32 runs the memory-efficient kernel, which has no grouped-query support: fp32 with GQA
    (enable_gqa, as Hugging Face passes it without a padding mask) runs the math kernel, which
    materializes the scores and repeats K and V."""
    if attention == "unfused":
        return "math"
    if attention in ("triton", "flash1") and precision == "fp32":
        return "math"  # the Triton kernel and FlashAttention-1 take 16-bit inputs only
    if attention == "flash1" and spec.d_head > FLASH1_MAX_HEAD_DIM:
        raise ConfigError(
            "attention",
            attention,
            f"a kernel that runs head dim {spec.d_head}: FlashAttention-1 compiles head dims up "
            f"to {FLASH1_MAX_HEAD_DIM} only (flash, fused, sdpa or unfused)",
        )
    if attention == "sdpa":
        if precision == "fp32":
            return "math" if spec.n_kv_heads < spec.heads else "mem_efficient"
        return "flash"
    return attention


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """One batch of candidates with everything the cost terms need (module docstring)."""

    spec: TransformerSpec
    hw: HardwareProfile
    sw: Software
    precision: str
    optimizer: str
    seq: float
    global_batch: int
    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    """Context-parallel degree: each sequence split over cp ranks."""
    cp_comm: np.ndarray
    """Index into planner.parallel.CP_COMMS (p2p ring, all_gather, a2a)."""
    ep: np.ndarray
    """Expert-parallel degree: the routed experts of a block sharded over ep ranks (cost_models.moe)."""
    etp: np.ndarray
    """Expert tensor-parallel degree (each expert's width split over expert_tp ranks)."""
    shard: np.ndarray
    """Data-parallel ranks a ZeRO stage >= 1 shards its states over (dp_shard, or dp): with cp, the
    shard group is shard x cp ranks (context-parallel ranks hold the same weights)."""
    b: np.ndarray
    """Micro-batch (sequences)."""
    v: np.ndarray
    """Virtual stages (model chunks per pipeline rank)."""
    m: np.ndarray
    """Micro-batches per step per pipeline (global_batch / (dp b))."""
    zero: np.ndarray
    sp: np.ndarray
    """Sequence parallelism in effect (requested and tp > 1)."""
    recompute: np.ndarray
    offload: np.ndarray
    schedule: np.ndarray
    local: Mapping[str, np.ndarray]
    """Ranks per node (NVLink domain) of the groups (planner.placement.group_locality): D, P, T, C,
    DC (the gradient group over dp x cp), S (the shard group over shard x cp), R (its replicas); the
    expert layers' E (ep), ET (expert_tp), ED (expert data parallel), ES / ER (its shard group and replicas)."""
    blocks_first: np.ndarray
    blocks_last: np.ndarray
    blocks_most: np.ndarray
    """Blocks of the first, the last and the busiest pipeline rank."""
    blocks_second: np.ndarray
    """Blocks of the second pipeline rank (even split; the busiest rank's count for an explicit split)."""
    table: B.BlockTable
    head: B.HeadTable
    c: float
    """Bytes of an activation element in the math dtype."""
    sac: B.OpSac | None = None
    """The per-operator selective policy where the framework's `selective` means it (torchtitan), else None
    (Megatron's attention-core policy)."""
    recompute_layers: np.ndarray | None = None
    """With full recomputation, the blocks recomputed in each pipeline chunk (0 or None: all of them;
    Megatron-Core's --recompute-method block --recompute-num-layers)."""
    rank_recomputed: np.ndarray | None = None
    """With explicit chunks (CandidateArrays.rank_recomputed): blocks each pipeline rank recomputes, the sum over its
    chunks of min(recompute_layers, chunk blocks), shape (candidates, R); None: from the even split."""
    recomputed_ends: tuple | None = None
    """(first, last, busiest) ranks' recomputed blocks from rank_recomputed, or None."""
    rank_blocks: np.ndarray | None = None
    """Blocks of every pipeline rank (CandidateArrays.rank_blocks), shape (candidates, R), -1 past
    pp; None: the even split (rank_block_counts)."""

    @property
    def attention_precision(self) -> str:
        """The precision attention, the LM head and the loss run in: FP8 recipes quantize only the
        linear layers of the blocks and keep attention and the output layer in bf16."""
        return "amp-bf16" if self.precision == "fp8" else self.precision

    @property
    def linear_precision(self) -> str:
        """The math the blocks' linear GEMMs run in (compute.linear_gemm_precision)."""
        return linear_gemm_precision(self.precision, self.sw.fp8_scaling)

    @property
    def attn_kernel(self) -> str:
        """The attention kernel that runs (attention_kernel): fused, flash, mem_efficient or math."""
        return self.sw.kernel(self.precision, self.spec)

    @classmethod
    def of(
        cls,
        spec: TransformerSpec,
        hw: HardwareProfile,
        sw: Software,
        cands,
        *,
        global_batch: int,
        seq: int,
        precision: str,
        optimizer: str,
    ) -> "Step":
        f64 = lambda a: np.asarray(a, dtype=float)  # noqa: E731
        dp, tp, pp, b, v = (
            f64(cands.dp),
            f64(cands.tp),
            f64(cands.pp),
            f64(cands.micro_batch),
            f64(cands.virtual_stages),
        )
        cp = f64(cands.cp) if cands.cp is not None else np.ones_like(dp)
        cp_comm = (
            np.asarray(cands.cp_comm)
            if cands.cp_comm is not None
            else np.zeros(dp.shape, dtype=np.int64)
        )
        dp_shard = f64(cands.dp_shard) if cands.dp_shard is not None else np.zeros_like(dp)
        shard = np.where(dp_shard > 0, dp_shard, dp)
        ep = f64(cands.ep) if getattr(cands, "ep", None) is not None else np.ones_like(dp)
        etp = (
            f64(cands.expert_tp)
            if getattr(cands, "expert_tp", None) is not None
            else np.ones_like(dp)
        )
        if spec.moe is not None and sw.framework.experts_follow_tp_without_ep:
            etp = np.where(
                ep == 1, tp, etp
            )  # torchtitan shards the experts over tp when ep = 1 (frameworks)
        first, last, most, second = _blocks_per_rank(cands, spec.total_blocks)
        return cls(
            spec=spec,
            hw=hw,
            sw=sw,
            precision=precision,
            optimizer=optimizer,
            seq=float(seq),
            global_batch=global_batch,
            dp=dp,
            tp=tp,
            pp=pp,
            cp=cp,
            cp_comm=cp_comm,
            ep=ep,
            etp=etp,
            shard=shard,
            b=b,
            v=v,
            m=global_batch / (dp * b),
            zero=np.asarray(cands.zero),
            sp=np.asarray(cands.sequence_parallel, dtype=bool) & (tp > 1),
            recompute=np.asarray(cands.recompute),
            offload=np.asarray(cands.offload),
            schedule=np.asarray(cands.schedule),
            local=group_locality(
                cands.placement,
                cands.dp,
                cands.pp,
                cands.tp,
                hw.nvlink_domain_devices,
                cp=cp.astype(np.int64),
                dp_shard=shard.astype(np.int64),
                ep=ep.astype(np.int64),
                expert_tp=etp.astype(np.int64),
            ),
            blocks_first=first,
            blocks_last=last,
            blocks_most=most,
            blocks_second=second,
            table=block_table_of(sw, spec, precision, cands.zero),
            head=B.head_table(spec, precision, sw.framework.kernels, sw.loss),
            c=float(B.compute_bytes(precision)),
            sac=selective_policy(sw, spec, precision),
            recompute_layers=None
            if getattr(cands, "recompute_layers", None) is None
            else f64(cands.recompute_layers),
            rank_blocks=None
            if getattr(cands, "rank_blocks", None) is None
            else np.atleast_2d(np.asarray(cands.rank_blocks, dtype=float)),
            **_explicit_recomputed(cands),
        )

    @property
    def tokens(self) -> np.ndarray:
        """Tokens of one micro-batch on one rank: b s / cp (context parallelism splits the sequence)."""
        return self.b * self.seq / self.cp

    @property
    def grad_group(self) -> np.ndarray:
        """Ranks that reduce the same gradients: dp x cp."""
        return self.dp * self.cp

    @property
    def shard_group(self) -> np.ndarray:
        """Ranks a ZeRO stage >= 1 shards states over: shard x cp (all of dp x cp without hybrid sharding)."""
        return self.shard * self.cp

    @property
    def expert_dp(self) -> np.ndarray:
        """Ranks holding the same expert shard and reducing its gradients: tp cp dp / (ep expert_tp)
        (planner.parallel.expert_data_parallel)."""
        return np.maximum(self.tp * self.cp * self.dp / (self.ep * self.etp), 1.0)

    @property
    def expert_shard_group(self) -> np.ndarray:
        """Ranks a ZeRO stage >= 1 shards expert states over: the expert data-parallel group, cut like the
        dense one under hybrid sharding (expert_dp x shard / dp, at least 1)."""
        return np.maximum(np.floor(self.expert_dp * self.shard / self.dp), 1.0)

    @property
    def full(self) -> np.ndarray:
        return self.recompute == RECOMPUTE.index("full")

    @property
    def selective(self) -> np.ndarray:
        return self.recompute == RECOMPUTE.index("selective")

    def recomputed_blocks(self, n_blocks, rank=None) -> np.ndarray:
        """Of pipeline rank `rank`'s `n_blocks` (its v chunks), the blocks full recomputation re-runs: all of them, or
        recompute_layers per chunk (Megatron-Core's 'block' method recomputes the first N layers of each chunk,
        megatron/core/transformer/transformer_block.py _checkpointed_forward), summed over the rank's chunks:
        min(N v, n) for an even split (chunks within one block of each other), the explicit chunks' sum
        (rank_recomputed) when the rank is named and the candidate has explicit chunks; 0 without full
        recomputation."""
        n = np.asarray(n_blocks, dtype=float)
        if self.recompute_layers is None:
            return np.where(self.full, n, 0.0)
        per_chunk = np.where(
            self.recompute_layers > 0, np.minimum(self.recompute_layers * self.v, n), n
        )
        if rank is not None and self.rank_recomputed is not None:
            rr = np.atleast_2d(np.asarray(self.rank_recomputed, dtype=float))
            r = np.clip(np.asarray(rank).astype(int), 0, rr.shape[1] - 1)
            exact = (
                rr[0, r]
                if rr.shape[0] == 1
                else rr[np.arange(rr.shape[0]), np.broadcast_to(r, rr.shape[:1])]
            )
            per_chunk = np.where(self.recompute_layers > 0, exact, n)
        return np.where(self.full, per_chunk, 0.0)

    def rank_block_counts(self, row: int = 0) -> list[float]:
        """Blocks of each pipeline rank of candidate `row`: rank_blocks when given, else the even
        split of _blocks_per_rank (rank k runs chunks k, k + p, ...: v q + ceil((r - k) / p)^+)."""
        p = int(np.broadcast_to(self.pp, np.shape(self.dp)).reshape(-1)[row])
        if self.rank_blocks is not None:
            given = self.rank_blocks[row if self.rank_blocks.shape[0] > 1 else 0]
            return [float(b) for b in given[:p]]
        v = float(np.broadcast_to(self.v, np.shape(self.dp)).reshape(-1)[row])
        blocks = self.spec.total_blocks
        q = blocks // int(p * v)
        r = blocks - q * p * v
        return [v * q + max(0.0, float(np.ceil((r - k) / p))) for k in range(p)]

    def recomputed_at_ends(self):
        """(first, last, busiest) ranks' recomputed blocks (recomputed_blocks of blocks_first, blocks_last and
        blocks_most, exact with explicit chunks)."""
        if self.recomputed_ends is not None and self.recompute_layers is not None:
            on = self.full & (self.recompute_layers > 0)
            return tuple(
                np.where(on, e, self.recomputed_blocks(n))
                for e, n in zip(
                    self.recomputed_ends, (self.blocks_first, self.blocks_last, self.blocks_most)
                )
            )
        return tuple(
            self.recomputed_blocks(n)
            for n in (self.blocks_first, self.blocks_last, self.blocks_most)
        )

    @property
    def full_share(self) -> np.ndarray:
        """Share of the busiest rank's blocks that full recomputation re-runs (1 for every block, 0 without full
        recomputation): what the per-block recomputation time and host operators scale by (the other ranks'
        own counts are added back in cost_models.pipeline.stage_seconds)."""
        most = np.maximum(self.blocks_most, 1.0)
        return self.recomputed_at_ends()[2] / most

    @property
    def a2a_overlap(self):
        """Per candidate, whether the expert-parallel exchange runs beside another micro-batch's
        compute: the run's moe_a2a_overlap where Megatron-Core runs it on the plan
        (frameworks.rules.a2a_overlap_runs); False without the option or for a dense model."""
        if not self.sw.moe_a2a_overlap or self.spec.moe is None:
            return False
        return a2a_overlap_runs(
            ep=self.ep,
            pp=self.pp,
            virtual_stages=self.v,
            full_recompute=self.full,
            precision=self.precision,
            recompute_modules=self.sw.recompute_modules or (),
            mtp_modules=getattr(self.spec, "mtp_modules", 0),
        )

    @property
    def single_stage(self) -> np.ndarray:
        return self.pp == 1

    BLOCK_LOCALITY = ("T", "C", "E", "ET")
    """The groups whose links the per-block terms read (tensor, context, expert, expert-tensor parallel); the
    others (D, P, DC, S, R, ED, ES, ER) are read only by the step-level terms."""

    def block_rows(self, least: int = 256) -> tuple[np.ndarray, np.ndarray] | None:
        """distinct_block_rows where it pays: None with fewer than `least` candidates, with explicit chunks
        (rank_recomputed) or when more than half the rows are distinct."""
        if int(np.size(self.dp)) < least or self.rank_recomputed is not None:
            return None
        first, inverse = self.distinct_block_rows()
        return (first, inverse) if 2 * len(first) <= np.size(self.dp) else None

    def distinct_block_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(first, inverse) over the candidates that are equal for the per-block terms (planner.score's
        block_terms: a block's compute, its tp / cp / ep collectives, the embedding and the head of one
        micro-batch; rows == rows[first][inverse]). Those terms read only the columns keyed here: b, tp, cp,
        cp_comm, ep, etp, sp, recompute, schedule, the share of blocks full recomputation re-runs (full_share),
        whether the exchange overlap runs (a2a_overlap), the links of BLOCK_LOCALITY and, where the block table differs per candidate (block_table_of's 16-bit
        table under ZeRO >= 2), zero. A search chunk of 16,384 candidates holds some 300 to 6,000 such rows:
        dp, pp, ZeRO and offload move only the step-level terms. tests/test_score_rows.py checks both halves:
        scored once per row or once per key, every term is equal, and the per-block terms read no other field."""
        n = int(np.size(self.dp))
        if self.recompute_layers is None and self.recomputed_ends is None:
            share = (
                self.blocks_most >= 1
            )  # full_share: 1 where full recomputation runs (recompute keyed)
        else:
            share = np.unique(np.broadcast_to(self.full_share, (n,)), return_inverse=True)[
                1
            ].ravel()
        cols = [
            self.b,
            self.tp,
            self.cp,
            self.cp_comm,
            self.ep,
            self.etp,
            self.sp,
            self.recompute,
            self.schedule,
            share,
        ]
        cols += [self.local[k] for k in self.BLOCK_LOCALITY if k in self.local]
        if self.sw.moe_a2a_overlap and self.spec.moe is not None:
            cols.append(self.a2a_overlap)  # reads pp and virtual stages (ep_block_seconds)
        if _per_row(self.table, n):
            cols.append(self.zero)
        return distinct_rows([np.broadcast_to(np.asarray(c), (n,)) for c in cols])

    def take(self, rows: np.ndarray) -> "Step":
        """The candidates `rows` of this batch (every per-candidate array indexed; the model, hardware and
        software records as they are)."""
        n = int(np.size(self.dp))
        keep = {"spec", "hw", "sw"}
        return replace(
            self,
            **{
                f.name: take_rows(getattr(self, f.name), rows, n)
                for f in fields(self)
                if f.name not in keep
            },
        )

    def is_schedule(self, name: str) -> np.ndarray:
        return self.schedule == SCHEDULES.index(name)

    def is_offload(self, kind: str) -> np.ndarray:
        """Per candidate, whether its offload moves `kind` ('optimizer', 'activations') to the host."""
        return _OFFLOADS[kind][self.offload]

    def per_token(self, terms: B.Terms) -> np.ndarray:
        """Bytes per token on one rank of a table entry: replicated / (tp with SP), sharded / tp, scores s / tp."""
        return terms.at(self.tp, self.sp, self.seq)


def _explicit_recomputed(cands) -> dict:
    """Step's rank_recomputed and recomputed_ends from CandidateArrays.rank_recomputed (explicit chunks), or {}."""
    rr = getattr(cands, "rank_recomputed", None)
    if rr is None or getattr(cands, "rank_blocks", None) is None:
        return {}
    rr = np.atleast_2d(np.asarray(rr, dtype=float))
    rb = np.atleast_2d(np.asarray(cands.rank_blocks, dtype=float))
    rows = np.arange(rr.shape[0])
    last = np.asarray(cands.pp, dtype=int) - 1
    ends = (rr[:, 0], rr[rows, np.broadcast_to(last, rows.shape)], rr[rows, np.argmax(rb, axis=1)])
    return {"rank_recomputed": rr, "recomputed_ends": ends}


def _blocks_per_rank(cands, blocks: int):
    """(first, last, busiest, second) blocks per pipeline rank. Even split (planner.estimate.even_stages):
    the p v chunks get q = L // (p v) blocks and the first r = L % (p v) one more; rank k runs chunks
    k, k + p, ... so it holds v q + ceil((r - k) / p)^+ blocks; rank 0 holds the most. With explicit
    first/last/busiest counts the second rank is taken as the busiest (an upper bound)."""
    pp = np.asarray(cands.pp, dtype=float)
    v = np.asarray(cands.virtual_stages, dtype=float)
    q = np.floor(blocks / (pp * v))
    r = blocks - q * pp * v
    even_first = v * q + np.ceil(r / pp)
    even_last = v * q + np.maximum(0.0, np.ceil((r - pp + 1) / pp))
    first = (
        even_first if cands.blocks_first is None else np.asarray(cands.blocks_first, dtype=float)
    )
    last = even_last if cands.blocks_last is None else np.asarray(cands.blocks_last, dtype=float)
    most = even_first if cands.blocks_max is None else np.asarray(cands.blocks_max, dtype=float)
    most = np.maximum(most, np.maximum(first, last))
    second = v * q + np.maximum(0.0, np.ceil((r - 1) / pp)) if cands.blocks_first is None else most
    return first, last, most, second


def take_rows(value, rows: np.ndarray, n: int):
    """`value` with every per-candidate array (leading length `n`) indexed by `rows`: arrays, the fields of records
    (block tables, term results), mappings and tuples, recursively; anything else as it is."""
    if isinstance(value, np.ndarray):
        return value[rows] if value.ndim >= 1 and value.shape[0] == n else value
    if isinstance(value, Mapping):
        return {k: take_rows(v, rows, n) for k, v in value.items()}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(take_rows(v, rows, n) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(
            value,
            **{f.name: take_rows(getattr(value, f.name), rows, n) for f in fields(value) if f.init},
        )
    return value


def _per_row(value, n: int) -> bool:
    """Whether a record holds a per-candidate array anywhere (take_rows' traversal)."""
    if isinstance(value, np.ndarray):
        return value.ndim >= 1 and value.shape[0] == n
    if is_dataclass(value) and not isinstance(value, type):
        return any(_per_row(getattr(value, f.name), n) for f in fields(value))
    return False
