"""Published training runs (validation/published/*.json, format in validation/published/FORMAT.md) as
planner inputs: the model, the hardware profile, the parallel configuration and the software each row
ran, and its measured step time. One place turns a row into what `estimate` takes, for every benchmark
and test that predicts published runs (benchmarks/accuracy_frameworks.py, benchmarks/calibrate_frameworks.py).
"""

from __future__ import annotations

import re
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cost_models.step import BF16_PARAM_PRECISIONS
from planner.errors import PlannerError
from planner.run_options import RunOptions
from frameworks import load_framework
from frameworks.rules import used_placement
from hardware_profiles import available_profiles, load_profile
from planner.catalog import get
from planner.parallel import ParallelConfig
from planner.partition import deepspeed_type_stages, embedding_and_loss_as_layers
from planner.spec import TransformerSpec

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "validation" / "published"
CLUSTERS = ROOT / "validation" / "hardware" / "clusters"
STACK_FILES = ("megatron", "torchtitan", "fsdp", "deepspeed")
"""The per-stack collections (dense models); features.json holds CP / FP8 / HSDP runs, moe.json MoE runs."""

ATTENTION = {
    "cudnn": "fused",
    "flash": "flash",
    "flash1": "flash1",
    "sdpa": "sdpa",
    "triton": "triton",
    "unfused": "unfused",
    None: None,
}
"""A row's `attention` in the framework's vocabulary (None: the framework's default kernel)."""
LOSS = {
    "fused_crossentropy": "fused",
    "torch_crossentropy": "upcast",
    "torch_crossentropy_16bit": "native",
    "te_parallel_cross_entropy": "inplace",
}
"""A row's extras.loss_fn in the planner's vocabulary (frameworks.LOSS_KERNELS)."""
ARCH_KEYS = (
    "model_type",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "position",
    "gated_mlp",
    "activation",
    "norm",
    "tied_embeddings",
    "qkv_bias",
    "out_bias",
    "mlp_bias",
    "mtp_modules",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One published row, ready to predict."""

    row: dict
    file: str
    spec: object
    hardware: object
    config: object
    options: RunOptions
    """The run options the row ran with (None fields: the framework's default)."""
    measured_s: float | None
    """The published step time (from iteration time, or global tokens / tokens per second)."""
    error: str | None = None
    """Why the row cannot become a model or configuration (one line; spec and config are then None)."""

    @property
    def id(self) -> str:
        return self.row["id"]

    @property
    def source(self) -> str:
        return self.row["source_id"]

    @property
    def framework(self) -> str:
        return self.row["framework"]

    @property
    def check_framework(self) -> bool:
        """False for a run of another stack costed as its closest one (`extras.framework_stand_in`, e.g.
        DeepSeek's own HAI-LLM as megatron): estimate then costs its run options even where that stack has not
        them (DualPipe's exchange overlap, FP8 dispatch), instead of refusing the row."""
        return not (self.row.get("extras") or {}).get("framework_stand_in")


@lru_cache(maxsize=None)
def hardware(name: str):
    """A shipped profile by name, else a validation cluster (validation/hardware/clusters/<name>.json)."""
    if name in available_profiles():
        return load_profile(name)
    return load_profile(str(CLUSTERS / f"{name}.json"))


def spec_of(row: dict):
    """The row's model: a catalog name, or its `arch` (TransformerSpec fields), at the row's sequence."""
    seq = row["seq"]
    if row.get("model"):
        spec = get(row["model"])
        spec = spec.with_(
            seq=seq, max_positions=max(spec.max_positions, seq) if spec.position == "learned" else 0
        )
        return _token_drop(
            row, spec.with_(**{k: v for k, v in (row.get("arch") or {}).items() if k in ARCH_KEYS})
        )
    arch = {k: v for k, v in row["arch"].items() if k in ARCH_KEYS and v is not None}
    arch.setdefault("kv_heads", 0)
    if arch.get("position", "learned") == "learned":
        arch["max_positions"] = seq
    return TransformerSpec(name=row["id"], seq=seq, **arch)


def _token_drop(row: dict, spec):
    """A row that drops tokens (extras.token_drop) routes with a capacity factor: the row's, else 1.0 with
    padding to capacity (NeMo's MegatronTokenDropCallback: moe_expert_capacity_factor 1.0,
    moe_pad_expert_input_to_capacity)."""
    extras = row.get("extras") or {}
    if spec.moe is None or not extras.get("token_drop"):
        return spec
    from dataclasses import replace

    return spec.with_(
        moe=replace(spec.moe, capacity_factor=float(extras.get("capacity_factor") or 1.0))
    )


def config_of(row: dict):
    """The row's ParallelConfig: its degrees, batch, schedule, ZeRO (and shard group), recompute,
    sequence parallelism, precision and framework; a placement the framework builds. A micro-batch the
    publication does not give (null; the DeepSeek-V3 report) is taken as 1 sequence."""
    fw = load_framework(row["framework"])
    v = row.get("virtual_stages") or 1
    schedule = row.get("schedule") or ("interleaved-1f1b" if v > 1 else "1f1b")
    if row["pp"] == 1:
        schedule = "1f1b"
    dp, cp, ep = row["dp"], row.get("cp") or 1, row.get("ep") or 1
    shard = row.get("dp_shard") or dp
    placement = used_placement(
        fw.capabilities.placements[0] if fw.capabilities.placements else "DPT", cp=cp, ep=ep
    )
    offload = {"params": "optimizer"}.get(
        row.get("offload") or "none", row.get("offload") or "none"
    )
    extras = row.get("extras") or {}
    if (
        extras.get("cpu_offloading_num_layers") and offload == "none"
    ):  # Megatron-Core's partial activation offload
        offload = "activations"
    if extras.get("activation_checkpoint_cpu_offload") and offload in ("none", "optimizer"):
        # DeepSpeed's activation_checkpointing.cpu_checkpointing, with or without offload_optimizer
        offload = "activations" if offload == "none" else "optimizer+activations"
    cp_comm = extras.get("cp_comm") or ((fw.capabilities.cp_comm or ("p2p",))[0])
    stages = ()
    if extras.get("pipeline_embedding_and_loss_as_layers"):
        stages = embedding_and_loss_as_layers(spec_of(row).total_blocks, row["pp"] * v)
    elif isinstance(
        extras.get("pp_stages"), list
    ):  # blocks per stage as the publication gives them
        stages = tuple(int(n) for n in extras["pp_stages"])
    elif (
        method := re.match(
            r"type:transformer(\|embed(ding)?)?\b", extras.get("pp_partition_method") or ""
        )
    ) and row["pp"] > 1:
        # Megatron-DeepSpeed's --pp-partition-method: blocks only (its default), or the embedding and the tied
        # head counted as blocks too

        stages = tuple(
            deepspeed_type_stages(
                spec_of(row).total_blocks, row["pp"], embeddings=bool(method.group(1))
            )
        )
    return ParallelConfig(
        dp=dp,
        tp=row["tp"],
        pp=row["pp"],
        cp=cp,
        ep=ep,
        expert_tp=row.get("expert_tp") or 1,
        dp_shard=0 if shard == dp else shard,
        zero=row.get("zero") or 0,
        micro_batch=row["micro_batch"] or 1,
        global_batch=row["global_batch"],
        schedule=schedule,
        virtual_stages=v,
        recompute=row.get("recompute") or "none",
        recompute_layers=extras.get("recompute_layers") if row.get("recompute") == "full" else None,
        sequence_parallel=bool(row.get("sequence_parallel")) and row["tp"] > 1,
        precision=row["precision"],
        offload=offload,
        placement=placement,
        seq=row["seq"],
        framework=row["framework"],
        cp_comm=cp_comm,
        stages=stages,
    )


MOE_DISPATCHER = {
    "alltoall": "alltoall",
    "deepep": "deepep",
    "flex/deepep": "deepep",
    "flex/hybridep": "deepep",
}
"""A row's `extras.moe_dispatcher` in cost_models.moe's vocabulary (HybridEP is NVIDIA's DeepEP-compatible
hierarchical dispatcher: same node-deduplicated traffic)."""


def options_of(row: dict) -> RunOptions:
    extras = row.get("extras") or {}
    out = {
        "attention": ATTENTION.get(row.get("attention")),
        "dropout": bool(extras.get("dropout", False)),
    }
    dispatcher = str(extras.get("moe_dispatcher") or "").lower()
    if dispatcher in MOE_DISPATCHER:
        out["moe_dispatcher"] = MOE_DISPATCHER[dispatcher]
    if "moe_a2a_overlap" in extras:
        out["moe_a2a_overlap"] = bool(extras["moe_a2a_overlap"])
    # torchao's rowwise recipe (torchtitan's float8_scaling / the torchao README's float8 recipe name),
    # Transformer Engine's delayed scaling or its MXFP8 block scaling (the recipe the row names)
    recipe = " ".join(str(extras.get(k) or "") for k in ("float8_scaling", "float8", "fp8_recipe"))
    recipe = recipe.lower()
    if row.get("precision") == "fp8" and "rowwise" in recipe:
        out["fp8_scaling"] = "rowwise"
    elif row.get("precision") == "fp8" and "delayed" in recipe:
        out["fp8_scaling"] = "delayed"  # Transformer Engine's DelayedScaling (amax history)
    elif row.get("precision") == "fp8" and "mxfp8" in recipe:
        out["fp8_scaling"] = "mxfp8"  # Transformer Engine's MXFP8BlockScaling
    elif row.get("precision") == "fp8" and "nvfp4" in recipe:
        out["fp8_scaling"] = "nvfp4"  # Transformer Engine's NVFP4BlockScaling
    if extras.get("cpu_offloading_num_layers"):
        out["activation_offload_layers"] = int(extras["cpu_offloading_num_layers"])
    if (
        extras.get("activation_func_fp8_input_store") is True
    ):  # Megatron-Core's SwiGLU input kept in FP8
        out["activation_fp8_input"] = True
    if (
        extras.get("bf16_optimizer") and row["framework"] == "deepspeed"
    ):  # DeepSpeed's BF16_Optimizer ran
        out["bf16_optimizer"] = True
    modules = extras.get(
        "recompute_modules"
    )  # Megatron-Core's --recompute-modules, when the run names them
    if modules and row.get("recompute") == "selective":
        out["recompute_modules"] = tuple(modules)
    if extras.get("norm_kernel") == "fused_rmsnorm":  # torchtitan's Triton RMSNorm (norm_type)
        out["fused_norm"] = True
    if isinstance(
        extras.get("expandable_segments"), bool
    ):  # the run's PYTORCH_CUDA_ALLOC_CONF, when known
        out["expandable_segments"] = extras["expandable_segments"]
    if extras.get("moe_fp8_dispatch"):
        out["moe_fp8_dispatch"] = True
    if extras.get("kernels") in ("fused", "eager", "torch"):
        out["kernels"] = extras["kernels"]
    if "overlap_grad_reduce" in extras:
        out["overlap_grad_reduce"] = bool(extras["overlap_grad_reduce"])
    # the dtype gradients are reduced in: NeMo's grad_reduce_dtype, FSDP's MixedPrecision reduce_dtype
    reduce = extras.get("grad_reduce_dtype", extras.get("fsdp_reduce_dtype"))
    if reduce in ("bf16", "fp32"):
        out["grad_reduce_dtype"] = reduce
    # NeMo 1.x's Apex distributed fused Adam keeps the fp32 master weights as 16-bit remainders beside bf16
    # parameters, unless the weights are FP8 (megatron_base_model.py, setup_optimization: fp8_params sets
    # store_params instead)
    apex_adam = "distributed_fused_adam" in str(extras.get("distributed_optimizer") or "")
    if apex_adam and row.get("precision") in BF16_PARAM_PRECISIONS and not extras.get("fp8_params"):
        out["master_weights"] = "remainder"
    # NeMo 1.x holds and gathers FP8 weights only with its fp8_params switch, off by default
    # (megatron_base_model.py: cfg.get('fp8_params', False) builds the model under TE's
    # fp8_model_init); rows that do not say take that default (the 24.07 rows say true, inferred:
    # validation/published/megatron.json, their `inferred`)
    if apex_adam and row.get("precision") == "fp8":
        out["fp8_param_gather"] = bool(extras.get("fp8_params"))
    if isinstance(extras.get("fp8_param_gather"), bool):  # the recipe's own setting, when known
        out["fp8_param_gather"] = extras["fp8_param_gather"]
    if "tp_comm_overlap" in extras or "async_tp" in extras:
        out["tp_comm_overlap"] = bool(extras.get("tp_comm_overlap") or extras.get("async_tp"))
    if row.get("compile"):
        out["compile"] = True
    if extras.get("loss_fn") in LOSS:
        out["loss"] = LOSS[extras["loss_fn"]]
    if extras.get("train_metrics"):  # Composer's per-micro-batch train metrics over the logits
        out["train_metrics"] = int(extras["train_metrics"])
    return RunOptions(**out)


def measured_step_s(row: dict, spec=None, convention: str | None = None) -> float | None:
    """Seconds per optimizer step as published: the iteration time, else global batch x seq over the
    token rate (per GPU x GPUs, or global), else the FLOPs the source's `tflops_convention` counts per
    step over its TFLOP/s per GPU x GPUs. None when the row gives none of them."""
    m = row.get("measured") or {}
    tokens = row["global_batch"] * row["seq"]
    if m.get("iteration_time_s"):
        return float(m["iteration_time_s"])
    if m.get("tokens_per_s_per_gpu"):
        return tokens / (float(m["tokens_per_s_per_gpu"]) * row["gpus"])
    if m.get("tokens_per_s"):
        return tokens / float(m["tokens_per_s"])
    if m.get("tflops_per_gpu") and convention and spec is not None:
        return convention_flops(spec, row["global_batch"], row["seq"], convention) / (
            float(m["tflops_per_gpu"]) * 1e12 * row["gpus"]
        )
    return None


def convention_flops(spec, global_batch: int, seq: int, convention: str) -> float:
    """FLOPs per step as a source counts them (validation/published/FORMAT.md `tflops_convention`):
    - nemo: NeMo / Megatron-Bridge's model FLOPs (NeMo's llama/gpt flops formulas, dgxc-benchmarking
      notes): per token 12 L h^2 (1 + kv_heads/heads + s/h) + 6 c L ffn h + 6 V h, c = 3 for a gated
      MLP (2 otherwise); causal attention not halved, recompute not counted;
    - megatron-hfu: Narayanan et al. 2021 Eq. 3, the hardware FLOPs with full recomputation that
      Megatron-LM and Megatron-DeepSpeed log: 96 B s L h^2 (1 + s/(6h) + V/(16 L h))."""
    L, h, V = spec.layers, spec.hidden, spec.vocab
    if convention == "nemo":
        kv = spec.n_kv_heads / spec.heads
        per_token = (
            12 * L * h * h * (1 + kv + seq / h)
            + 6 * (3 if spec.gated_mlp else 2) * L * spec.d_ffn * h
            + 6 * V * h
        )
        return float(per_token) * global_batch * seq
    if convention == "megatron-hfu":
        return 96.0 * global_batch * seq * L * h * h * (1 + seq / (6 * h) + V / (16 * L * h))
    raise ValueError(f"unknown tflops_convention {convention!r}")


def load(files=STACK_FILES) -> list[Case]:
    """Every trained row of the named collections (documented OOM rows are kept with measured_s None)."""
    cases = []
    for name in files:
        data = json.loads((PUBLISHED / f"{name}.json").read_text())
        for row in data["runs"]:
            convention = (data["sources"].get(row["source_id"]) or {}).get("tflops_convention")
            try:
                spec, config = spec_of(row), config_of(row)
            except PlannerError as err:  # kept, and counted as refused by the benchmarks
                cases.append(
                    Case(
                        row=row,
                        file=name,
                        spec=None,
                        hardware=hardware(row["hardware"]),
                        config=None,
                        options=options_of(row),
                        measured_s=None,
                        error=str(err),
                    )
                )
                continue
            measured = measured_step_s(row, spec, convention) if row.get("trained", True) else None
            cases.append(
                Case(
                    row=row,
                    file=name,
                    spec=spec,
                    hardware=hardware(row["hardware"]),
                    config=config,
                    options=options_of(row),
                    measured_s=measured,
                )
            )
    return cases
