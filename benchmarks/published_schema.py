"""The schema of a published training run row (validation/published/*.json `runs`, format in
validation/published/FORMAT.md), declared once with planner.data_schema: every key a row may hold,
its type, vocabulary, range and unit, and what it means. tests/test_published_schema.py checks every
row against it; benchmarks/data_files_doc.py renders it into docs/data-files.md.

The `extras` block holds the publication's own settings: the keys benchmarks/published_rows.py reads
are typed here; the others are declared by name only (recorded as published, not read), so a
misspelt key is refused instead of silently ignored.
"""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

from benchmarks.published_rows import ARCH_KEYS, ATTENTION, CLUSTERS, LOSS, MOE_DISPATCHER
from cost_models.blocks import RECOMPUTE_MODULES
from frameworks.profile import KERNELS
from hardware_profiles import available_profiles
from planner.catalog import names as catalog_names
from planner.data_schema import Field, check_document
from planner.parallel import CP_COMMS, FRAMEWORKS, PRECISIONS, RECOMPUTE, SCHEDULES
from planner.spec import Norm, Position

HARDWARE = tuple(available_profiles()) + tuple(sorted(p.stem for p in CLUSTERS.glob("*.json")))
"""A row's `hardware`: a shipped profile or a validation cluster (benchmarks.published_rows.hardware)."""
OFFLOADS = ("none", "optimizer", "params", "activations")
"""A row's `offload` as FORMAT.md spells it ('params' is costed as 'optimizer': config_of)."""
MEMORY_KINDS = ("allocated", "reserved", "nvidia-smi")


def _flag(doc: str) -> Field:
    return Field(kind="bool", required=False, doc=doc)


def _degree(doc: str) -> Field:
    return Field(kind="int", low=1, doc=doc)


def _rate(doc: str, unit: str) -> Field:
    return Field(kind="number", required=False, low=0, low_open=True, unit=unit, doc=doc)


def _fraction(doc: str) -> Field:
    return Field(kind="number", required=False, low=0, low_open=True, high=1, doc=doc)


def _size(doc: str) -> Field:
    return Field(kind="int", required=False, low=1, doc=doc)


ARCH: dict[str, Field] = {
    "model_type": Field(kind="str", required=False, nonempty=True, doc="Hugging Face model_type."),
    "layers": _size("Transformer blocks."),
    "hidden": _size("Hidden size."),
    "heads": _size("Attention heads."),
    "kv_heads": _size("Key/value heads (heads for multi-head attention)."),
    "head_dim": _size("Dimension of one head."),
    "ffn": _size("MLP inner size."),
    "vocab": _size("Vocabulary size (as trained, padding included where published)."),
    "position": Field(
        kind="str", required=False, allowed=get_args(Position), doc="Position embedding."
    ),
    "gated_mlp": Field(kind="bool", required=False, doc="Gated (SwiGLU/GeGLU) MLP."),
    "activation": Field(
        kind="str", required=False, nonempty=True, doc="MLP activation (planner.spec)."
    ),
    "norm": Field(kind="str", required=False, allowed=get_args(Norm), doc="Normalization."),
    "tied_embeddings": Field(kind="bool", required=False, doc="Output head shares the embedding."),
    "qkv_bias": Field(kind="bool", required=False, doc="Bias on the query/key/value projections."),
    "out_bias": Field(kind="bool", required=False, doc="Bias on the attention output projection."),
    "mlp_bias": Field(kind="bool", required=False, doc="Bias on the MLP projections."),
    "mtp_modules": Field(
        kind="int", required=False, low=0, doc="Multi-token-prediction modules (DeepSeek-V3)."
    ),
    "embed_norm": _flag(
        "Layer norm after the embedding (BLOOM); recorded, not read by published_rows.spec_of."
    ),
    "parallel_block": _flag(
        "Attention and MLP in parallel (GPT-NeoX); recorded, not read by published_rows.spec_of."
    ),
    "max_positions": _size("Rows of a learned position table; recorded, not read (spec_of: seq)."),
    "rope_theta": Field(
        kind="number",
        required=False,
        low=0,
        low_open=True,
        doc="Rotary base; recorded, not read by published_rows.spec_of.",
    ),
}
"""TransformerSpec fields of a row whose model is not in the catalog (each of ARCH_CORE then
required: check_row), or that override a catalog model's (then any of them)."""
ARCH_CORE = tuple(k for k in ARCH_KEYS if k != "mtp_modules")
"""The arch keys a row without a catalog model must give (benchmarks.published_rows.spec_of)."""
assert set(ARCH_KEYS) <= set(ARCH), "every arch key published_rows reads is declared"

MEASURED: dict[str, Field] = {
    "iteration_time_s": _rate("Seconds per optimizer step.", "s"),
    "tokens_per_s_per_gpu": _rate("Global tokens per second / gpus.", "tokens/s"),
    "tokens_per_s": _rate("Global tokens per second.", "tokens/s"),
    "tflops_per_gpu": _rate(
        "Model TFLOP/s per GPU as the source counts them (its sources[].tflops_convention).",
        "TFLOP/s",
    ),
    "mfu": _fraction("Model FLOPs utilization as the source counts it."),
    "hfu": _fraction("Hardware FLOPs utilization (recomputation counted) as published."),
    "samples_per_s": _rate("Global sequences per second.", "sequences/s"),
    "gpu_hours_per_trillion_tokens": _rate("GPU-hours per 10^12 training tokens.", "GPU-h"),
    "pretraining_h800_gpu_hours": _rate("H800 GPU-hours of the whole pre-training.", "GPU-h"),
    "total_h800_gpu_hours": _rate("H800 GPU-hours of all training stages.", "GPU-h"),
    "pretraining_tokens": _rate("Tokens of the whole pre-training.", "tokens"),
}
"""What the publication reports, as published (one or more; benchmarks.published_rows.measured_step_s
reads iteration time, token rates and TFLOP/s)."""

_READ_EXTRAS: dict[str, Field] = {
    "overlap_grad_reduce": _flag("The data-parallel reduction overlaps the backward."),
    "grad_reduce_dtype": Field(
        kind="str", required=False, allowed=("bf16", "fp32"), doc="NeMo's grad_reduce_dtype."
    ),
    "fsdp_reduce_dtype": Field(
        kind="str",
        required=False,
        allowed=("bf16", "fp32"),
        doc="FSDP MixedPrecision reduce_dtype.",
    ),
    "loss_fn": Field(
        kind="str", required=False, allowed=tuple(LOSS), doc="Cross-entropy implementation."
    ),
    "cp_comm": Field(
        kind="str", required=False, allowed=CP_COMMS, doc="Context-parallel KV exchange."
    ),
    "train_metrics": Field(
        kind="int",
        required=False,
        low=0,
        high=8,
        doc="Cross-entropy train metrics the trainer updates on every micro-batch (Composer).",
    ),
    "dropout": _flag("Dropout on (costs its masks)."),
    "recompute_modules": Field(
        kind="list",
        required=False,
        items="str",
        allowed=RECOMPUTE_MODULES,
        doc="Megatron-Core's --recompute-modules (with recompute 'selective').",
    ),
    "recompute_layers": Field(
        kind="int",
        required=False,
        low=1,
        doc="Blocks per pipeline chunk fully recomputed (with recompute 'full').",
    ),
    "activation_checkpoint_cpu_offload": _flag("DeepSpeed's cpu_checkpointing."),
    "activation_func_fp8_input_store": _flag("SwiGLU input kept in FP8 for the backward."),
    "cpu_offloading_num_layers": Field(
        kind="int", required=False, low=0, doc="Megatron-Core's partial activation offload."
    ),
    "pp_partition_method": Field(
        kind="str",
        required=False,
        nonempty=True,
        doc="Megatron-DeepSpeed's 'type:transformer[|embedding]' (a note may follow).",
    ),
    "pp_stages": Field(
        kind="list", required=False, items="int", doc="Blocks per pipeline stage as published."
    ),
    "pipeline_embedding_and_loss_as_layers": _flag("Megatron's account-for layout."),
    "framework_stand_in": _flag("The run's own stack is none of the four; `framework` is closest."),
    "moe_dispatcher": Field(
        kind="str",
        required=False,
        nonempty=True,
        doc="Token dispatcher, any case: " + ", ".join(MOE_DISPATCHER) + ".",
    ),
    "moe_a2a_overlap": _flag("Expert-parallel exchanges overlapped with other micro-batches."),
    "moe_fp8_dispatch": _flag("Tokens dispatched in FP8."),
    "token_drop": _flag("Routing drops tokens beyond the capacity factor."),
    "capacity_factor": Field(
        kind="number",
        required=False,
        nullable=True,
        null_means="1.0 with padding",
        low=0,
        low_open=True,
        doc="Expert capacity factor with token_drop.",
    ),
    "float8_scaling": Field(
        kind="str", required=False, nullable=True, doc="torchtitan's float8 scaling recipe."
    ),
    "float8": Field(kind="str", required=False, doc="torchao float8 recipe, as published."),
    "fp8_recipe": Field(kind="str", required=False, doc="FP8 scaling recipe, as published."),
    "fp8_params": _flag("Parameters kept in FP8 (NeMo fp8_params)."),
    "fp8_param_gather": _flag(
        "The recipe's own fp8_param_gather (Megatron-Bridge mixed-precision configs): the GEMM "
        "weights held and gathered in the recipe's low precision (RunOptions.fp8_param_gather)."
    ),
    "bf16_optimizer": Field(
        kind="str", required=False, nonempty=True, doc="DeepSpeed's BF16_Optimizer ran (how)."
    ),
    "distributed_optimizer": Field(
        kind="str", required=False, nonempty=True, doc="Distributed optimizer, as published."
    ),
    "norm_kernel": Field(kind="str", required=False, doc="Norm kernel ('fused_rmsnorm': Triton)."),
    "expandable_segments": _flag("The run's PYTORCH_CUDA_ALLOC_CONF expandable_segments."),
    "kernels": Field(kind="str", required=False, allowed=KERNELS, doc="Block implementation."),
    "tp_comm_overlap": _flag("Tensor-parallel collectives overlapped with GEMMs."),
    "async_tp": _flag("torch's async tensor parallelism."),
}
"""The extras benchmarks/published_rows.py reads (config_of, options_of, _token_drop)."""

RECORDED_EXTRAS = (
    "activation_checkpointing",
    "activation_checkpointing_reentrant",
    "attention_backend",
    "attention_dropout",
    "attention_softmax_in_fp32",
    "attn_impl",
    "backward_prefetch",
    "batch_ramp",
    "bias_dropout_fusion",
    "bias_gelu_fusion",
    "cuda_graphs",
    "defer_embedding_wgrad_compute",
    "delay_wgrad_compute",
    "dropless",
    "dropless_tflops_per_gpu",
    "ep_span",
    "expert_dp",
    "float8_linear",
    "float8_skips_output_head",
    "force_recompute_fp8_weight_in_bwd",
    "forward_prefetch",
    "fp8_detail",
    "fp8_linear",
    "fsdp_float8_all_gather",
    "fsdp_mixed_precision",
    "fsdp_param_dtype",
    "fsdp_sharding_strategy",
    "fsdp_shards_over",
    "fused_softmax",
    "grad_accum",
    "grad_reduce_in_fp32",
    "gradient_accumulation_steps",
    "hidden_dropout",
    "keep_fp8_transpose_cache",
    "layernorm_zero_centered_gamma",
    "layers_per_stage",
    "limit_all_gathers",
    "local_batch",
    "masked_softmax_fusion",
    "megatron_fsdp",
    "moe_force_balance",
    "moe_router_fusion",
    "mtp_depth",
    "nccl_ub",
    "no_tensor_parallel",
    "optimizer_cpu_offload",
    "overlap_p2p_comm",
    "overlap_param_gather",
    "partition_activations",
    "pipeline_schedule_detail",
    "precompute_float8_dynamic_scale",
    "recompute_detail",
    "reshard_after_forward",
    "rotary_pct",
    "rotary_percentage",
    "sec_per_it_at_iteration",
    "sharding_strategy",
    "transformer_engine",
    "use_orig_params",
    "zero_overlap_comm",
    "zero_reduce_scatter",
    "zero_stage_config",
)
"""Extras recorded as published for the reader and not read by the planner; a new one is added
here by name (and typed above once the planner reads it)."""

EXTRAS: dict[str, Field] = {
    **_READ_EXTRAS,
    **{
        name: Field(kind="any", required=False, doc="Recorded as published; not read.")
        for name in RECORDED_EXTRAS
    },
}

ROW: dict[str, Field] = {
    "id": Field(kind="str", nonempty=True, doc="Short id, unique over all files."),
    "source_id": Field(kind="str", nonempty=True, doc="Its publication: a key of `sources`."),
    "framework": Field(kind="str", allowed=FRAMEWORKS, doc="The stack (frameworks/<name>.json)."),
    "framework_detail": Field(kind="str", nonempty=True, doc="Versions and settings, as run."),
    "model": Field(
        kind="str",
        nullable=True,
        null_means="`arch` gives the model",
        allowed=tuple(catalog_names()),
        doc="A planner/catalog.py model the run trained exactly.",
    ),
    "arch": Field(
        kind="object",
        nullable=True,
        null_means="the catalog model as is",
        fields=ARCH,
        doc="TransformerSpec fields where `model` is null or differs.",
    ),
    "params_published": Field(
        kind="number",
        nullable=True,
        null_means="not given",
        low=0,
        low_open=True,
        unit="parameters",
        doc="The publication's own parameter count.",
    ),
    "hardware": Field(
        kind="str", allowed=HARDWARE, doc="A shipped profile or a validation cluster file."
    ),
    "hardware_note": Field(
        kind="str", required=False, doc="The publication's hardware words, where normalized."
    ),
    "gpu": Field(kind="str", nonempty=True, doc="GPU as published, e.g. 'H100 80GB SXM'."),
    "gpus": _degree("GPUs of the run."),
    "dp": _degree("Data-parallel degree."),
    "tp": _degree("Tensor-parallel degree."),
    "pp": _degree("Pipeline-parallel degree."),
    "cp": _degree("Context-parallel degree."),
    "ep": _degree("Expert-parallel degree."),
    "expert_tp": _degree("Experts' own tensor-parallel degree."),
    "dp_shard": _degree("ZeRO/FSDP shard group (HSDP: < dp; 1 with ZeRO 0)."),
    "zero": Field(kind="int", allowed=(0, 1, 2, 3), doc="ZeRO stage (FSDP FULL_SHARD: 3)."),
    "virtual_stages": _degree("Virtual pipeline stages per rank."),
    "schedule": Field(
        kind="str",
        nullable=True,
        null_means="1f1b, interleaved with virtual stages",
        allowed=SCHEDULES,
        doc="Pipeline schedule.",
    ),
    "micro_batch": Field(
        kind="int",
        low=1,
        nullable=True,
        null_means="not published; taken as 1",
        unit="sequences",
        doc="Micro-batch.",
    ),
    "global_batch": Field(kind="int", low=1, unit="sequences", doc="Global batch."),
    "seq": Field(kind="int", low=1, unit="tokens", doc="Sequence length."),
    "recompute": Field(
        kind="str",
        nullable=True,
        null_means="not stated; costed as none",
        allowed=RECOMPUTE,
        doc="Activation recomputation.",
    ),
    "recompute_detail": Field(
        kind="str", required=False, doc="Partial recomputation, as published."
    ),
    "sequence_parallel": Field(kind="bool", doc="Tensor-parallel sequence parallelism."),
    "precision": Field(kind="str", allowed=PRECISIONS, doc="Training precision."),
    "attention": Field(
        kind="str",
        nullable=True,
        null_means="the framework's default",
        allowed=tuple(k for k in ATTENTION if k),
        doc="Attention kernel (triton: the 2022-23 Triton FlashAttention).",
    ),
    "compile": Field(kind="bool", doc="torch.compile used."),
    "offload": Field(kind="str", allowed=OFFLOADS, doc="What the run offloads to the host."),
    "extras": Field(kind="object", fields=EXTRAS, doc="The publication's own settings."),
    "measured": Field(kind="object", fields=MEASURED, doc="What the publication reports."),
    "measured_memory_gib": Field(
        kind="number",
        nullable=True,
        null_means="not published",
        low=0,
        low_open=True,
        unit="GiB",
        doc="Memory per GPU as published.",
    ),
    "memory_kind": Field(
        kind="str",
        nullable=True,
        null_means="no memory published",
        allowed=MEMORY_KINDS,
        doc="What measured_memory_gib counts.",
    ),
    "trained": Field(kind="bool", doc="The configuration ran (false: a documented OOM)."),
    "inferred": Field(kind="strings", doc="Keys filled from text or defaults, and how."),
    "notes": Field(kind="str", doc="What a careful reader needs (e.g. the FLOP convention)."),
}
"""Every key of a published run row (validation/published/FORMAT.md)."""
WHAT = "published run"


def check_row(row: object, origin: str) -> None:
    """Refuse a row the schema refuses, or one whose model is null and whose arch lacks a key of
    ARCH_CORE (one ConfigError line naming the row and the key)."""
    check_document(row, ROW, origin, WHAT)
    if row["model"] is None:
        check_document(row["arch"] or {}, _REQUIRED_ARCH, origin, WHAT, prefix="arch.")


_REQUIRED_ARCH = {k: replace(field, required=k in ARCH_CORE) for k, field in ARCH.items()}
