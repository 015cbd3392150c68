"""Evaluate one given configuration: validate it, score it with the vectorized model (arrays of
length one, so the scalar and the search can never disagree) and build the plan document
(docs/cli-contract.md, "JSON documents").
"""
from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass

import numpy as np

from cost_models import params as P
from cost_models.step import BF16_PARAM_PRECISIONS, FP8_SCALINGS, MASTER_WEIGHTS, Software
from frameworks import ATTENTION_KERNELS, KERNELS, LOSS_KERNELS, MOE_DISPATCHERS, FrameworkProfile, load_framework
from frameworks.rules import check_model_runnable, check_moe_runnable, check_runnable
from cost_models.compute import peak_flops
from hardware_profiles import HardwareProfile, load_profile
from planner.errors import ConfigError
from planner.parallel import CP_COMMS, OFFLOAD, RECOMPUTE, SCHEDULES, ParallelConfig, resolve_precision
from planner.placement import placement_index
from planner.score import CandidateArrays, Scores, score, timeline_scores

STEP_MODEL = "timeline"
"""What estimate() reads the step time off: "timeline" (the simulated step, cost_models.timeline;
the search's closed form stays its bound and ranking) or "closed" (planner.score's closed form)."""
from planner.spec import TransformerSpec

@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """The prediction for one configuration (all numbers per optimizer step / per GPU)."""

    model: TransformerSpec
    hardware: HardwareProfile
    config: ParallelConfig
    gpus: int
    software: Software
    """The stack and kernel choices the prediction assumed (framework profile, attention, dropout)."""
    from_config: tuple[str, ...] = ()
    """The software choices taken from the model's config (Hugging Face config.json: dropout, attention)."""
    scores: Scores
    """The length-1 arrays score() returned."""

    def _x(self, name: str) -> float:
        return float(np.asarray(getattr(self.scores, name)).reshape(-1)[0])

    @property
    def step_time_s(self) -> float:
        return self._x("step_time_s")

    @property
    def peak_bytes_per_gpu(self) -> int:
        return int(round(self._x("peak_bytes_per_gpu")))

    @property
    def fits(self) -> bool:
        """Peak plus allocator overhead and CUDA context within the device (Scores.fits, the one owner)."""
        return bool(np.asarray(self.scores.fits).reshape(-1)[0])

    @property
    def needed_bytes(self) -> int:
        """What the device must hold: the peak, the allocator's overhead and the CUDA context."""
        return int(round(self._x("needed_bytes")))

    @property
    def params(self) -> int:
        return int(P.total_params(self.model))

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.hardware.devices_per_node)

    @property
    def tokens_per_s(self) -> float:
        return self.config.tokens_per_step / self.step_time_s

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOPs (6 N tokens + attention, a causal core counted as the half of the square it needs, as
        Megatron-LM's num_floating_point_operations; recomputation not counted) per GPU per second / 1e12. With the
        full square (PaLM's convention) MFU could pass the peak GEMM efficiency at long sequences, a rate no kernel
        reaches (tests/test_invariants.py)."""
        return self.scores.model_flops_per_step / self.step_time_s / self.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu * 1e12 / peak_flops(self.hardware, self.config.precision)

    def time_breakdown_s(self) -> dict[str, float]:
        return {k: self._x(k) for k in Scores.BREAKDOWN} | {"recompute_part_of_compute": self._x("recompute")}

    def memory(self) -> dict:
        return {"peak_bytes_per_gpu": self.peak_bytes_per_gpu, "capacity_bytes": int(self.hardware.memory_bytes),
                "fits": self.fits, "needed_bytes": self.needed_bytes,
                "margin_bytes": int(self.hardware.memory_bytes) - self.needed_bytes,
                **{k: int(round(self._x(k))) for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                       "activations_bytes", "other_bytes", "saved_activations_bytes")}}

    def memory_per_rank(self) -> list[dict]:
        """Memory of every pipeline rank (all its chunks), rank 0 first: the same terms as memory()."""
        sm = self.scores.stage_memory
        if sm is None:
            return []
        out = []
        for k in range(self.config.pp):
            row = {name: int(round(float(sm[name][0, k]))) for name in sm}
            row["peak_bytes_per_gpu"] = row.pop("peak_bytes")
            out.append({"rank": k, **row})
        return out

    def to_document(self) -> dict:
        """The plan document of the contract (schema_version "1")."""
        cfg, spec = self.config, self.model
        plan = cfg.to_dict()
        plan["stages"] = list(cfg.stages) or even_stages(spec.total_blocks, cfg.pp * cfg.virtual_stages)
        sw = self.software
        return {
            "schema_version": "1",
            "model": {"name": spec.name, "params": self.params, "layers": spec.layers, "hidden": spec.hidden,
                      "heads": spec.heads, "kv_heads": spec.n_kv_heads, "ffn": spec.d_ffn, "vocab": spec.vocab,
                      "seq": cfg.seq, "arch": arch_of(spec)},
            "hardware": {"name": self.hardware.name, "gpus": self.gpus, "nodes": self.nodes,
                         "device": self.hardware.device, "devices_per_node": self.hardware.devices_per_node,
                         "memory_bytes": int(self.hardware.memory_bytes)},
            "plan": plan,
            "software": {"framework": sw.framework.name, "kernels": sw.framework.kernels, "attention": sw.attention,
                         "from_config": list(self.from_config),
                         "dropout": sw.dropout, "overlap_grad_reduce": sw.overlap_grad_reduce, "loss": sw.loss,
                         "tp_comm_overlap": sw.tp_comm_overlap, "compile": sw.compile,
                         "grad_reduce_bytes": sw.state_bytes(cfg.precision).reduce,
                         "master_weights": sw.master_weights, "expandable_segments": sw.expandable_segments,
                         **({"fused_norm": True} if sw.fused_norm else {}),
                         **({"recompute_modules": list(sw.recompute_modules)} if sw.recompute_modules else {}),
                         **({"bf16_optimizer": True} if sw.bf16_optimizer else {}),
                         **({"activation_fp8_input": True} if sw.activation_fp8_input else {}),
                         **({"fp8_scaling": sw.fp8_scaling} if cfg.precision == "fp8" else {}),
                         **({"moe_dispatcher": sw.moe_dispatcher, "moe_a2a_overlap": sw.moe_a2a_overlap,
                             "moe_imbalance": sw.imbalance, "moe_fp8_dispatch": sw.moe_fp8_dispatch}
                            if spec.moe is not None else {})},
            "prediction": {
                "step_time_s": self.step_time_s,
                "samples_per_s": cfg.global_batch / self.step_time_s,
                "tokens_per_s": self.tokens_per_s,
                "tflops_per_gpu": self.tflops_per_gpu,
                "mfu": self.mfu,
                "memory": self.memory(),
                "memory_per_rank": self.memory_per_rank(),
                "time_breakdown_s": self.time_breakdown_s(),
                **({"expert_parallel": self.expert_parallel()} if spec.moe is not None else {}),
            },
        }

    def expert_parallel(self) -> dict:
        """The expert layout and its exchanges (cost_models.moe.placement_summary): groups, links, the
        dispatcher, bytes and seconds of one dispatch, and the step's exchange time exposed vs hidden."""
        from cost_models.compute import block_seconds
        from cost_models.moe import placement_summary
        from cost_models.step import Step

        cfg = self.config
        x = getattr(self.scores, "step", None)      # the record score() costed the plan with
        if x is None:
            x = Step.of(self.model, self.hardware, self.software, candidate_of(cfg, self.model.total_blocks),
                        global_batch=cfg.global_batch, seq=cfg.seq, precision=cfg.precision, optimizer=cfg.optimizer)
        return placement_summary(x, block_seconds(x))


def arch_of(spec: TransformerSpec) -> dict:
    """Every shape field of the spec (planner.spec.TransformerSpec), so that a plan file describes the
    model completely (exports write a framework's model arguments from it)."""
    from dataclasses import asdict
    return {k: v for k, v in asdict(spec).items() if k not in ("name", "extras")}


def even_stages(blocks: int, chunks: int) -> list[int]:
    """Blocks per chunk as even as possible (the first chunks take the remainder; planner.partition.even_split)."""
    from planner.partition import even_split
    return list(even_split(blocks, chunks))


def rank_blocks(stages: list[int], pp: int) -> list[int]:
    """Blocks per pipeline rank: chunk c runs on rank c % pp (looped interleaving)."""
    out = [0] * pp
    for c, n in enumerate(stages):
        out[c % pp] += n
    return out


def rank_recomputed(stages: list[int], pp: int, recompute_layers: int) -> list[int]:
    """Blocks each pipeline rank fully recomputes when only the first `recompute_layers` of each chunk are
    (Megatron-Core's 'block' method counts per model chunk): the sum over the rank's chunks of min(N, chunk)."""
    out = [0] * pp
    for c, n in enumerate(stages):
        out[c % pp] += min(recompute_layers, n)
    return out


def candidate_of(cfg: ParallelConfig, blocks: int) -> CandidateArrays:
    """The configuration as length-1 candidate arrays (with its per-rank block counts, and with recompute_layers
    the blocks each rank recomputes)."""
    chunks = list(cfg.stages) or even_stages(blocks, cfg.pp * cfg.virtual_stages)
    per_rank = rank_blocks(chunks, cfg.pp)
    one = lambda x: np.asarray([x])
    return CandidateArrays(
        dp=one(cfg.dp), tp=one(cfg.tp), pp=one(cfg.pp), micro_batch=one(cfg.micro_batch),
        virtual_stages=one(cfg.virtual_stages), zero=one(cfg.zero), recompute=one(RECOMPUTE.index(cfg.recompute)),
        offload=one(OFFLOAD.index(cfg.offload)), sequence_parallel=one(cfg.sequence_parallel),
        schedule=one(SCHEDULES.index(cfg.schedule)), placement=one(placement_index(cfg.placement)),
        cp=one(cfg.cp), cp_comm=one(CP_COMMS.index(cfg.cp_comm)), dp_shard=one(cfg.dp_shard),
        ep=one(cfg.ep), expert_tp=one(cfg.expert_tp), recompute_layers=one(cfg.recompute_layers or 0),
        blocks_first=one(per_rank[0]), blocks_last=one(per_rank[-1]), blocks_max=one(max(per_rank)),
        rank_blocks=np.asarray([per_rank]),
        rank_recomputed=None if cfg.recompute_layers is None
        else np.asarray([rank_recomputed(chunks, cfg.pp, cfg.recompute_layers)]))


def software_for(framework: str | FrameworkProfile, *, attention: str | None = None, dropout: bool | None = None,
                 overlap_grad_reduce: bool | None = None, grad_reduce_dtype: str | None = None,
                 loss: str | None = None, tp_comm_overlap: bool | None = None, compile: bool = False,
                 moe_dispatcher: str | None = None, moe_a2a_overlap: bool | None = None,
                 moe_imbalance: float | None = None, moe_fp8_dispatch: bool = False,
                 kernels: str | None = None, fp8_scaling: str | None = None,
                 activation_offload_layers: int | None = None, master_weights: str | None = None,
                 expandable_segments: bool | None = None, fused_norm: bool = False,
                 recompute_modules=None, bf16_optimizer: bool = False,
                 activation_fp8_input: bool = False) -> Software:
    """The run's software: the framework profile (by name or record) with the attention kernel, dropout,
    gradient-reduction overlap and dtype, cross-entropy kernel, tensor-parallel overlap, torch.compile and
    expert-parallel choices (token dispatcher, exchange overlap, routed-token imbalance, FP8 dispatch;
    cost_models.moe) a run may set (None: the framework's default), and the block implementation when a
    run swaps the stack's modules for another's (`kernels`, frameworks.KERNELS: NeMo AutoModel runs FSDP2
    + DTensor like torchtitan with Transformer Engine's fused modules), and the master-weight storage
    (`master_weights`, cost_models.step.MASTER_WEIGHTS; 'remainder' only where the framework's capabilities
    have master_remainders), and whether PyTorch's allocator runs with expandable segments
    (`expandable_segments`; None: the framework launcher's default), and whether an eager stack's RMSNorms run as
    one fused kernel (`fused_norm`, torchtitan's fused_rmsnorm), and which modules selective recomputation re-runs
    where the framework names them (`recompute_modules`, Megatron-Core's; cost_models.blocks.RECOMPUTE_MODULES),
    and whether the fused SwiGLU stores its input in FP8 (`activation_fp8_input`, Megatron-Core's
    activation_func_fp8_input_store; check_activation_fp8_input checks the model)."""
    fw = framework if isinstance(framework, FrameworkProfile) else load_framework(framework)
    if kernels is not None:
        if kernels not in KERNELS:
            raise ConfigError("kernels", kernels, "one of " + ", ".join(KERNELS))
        from dataclasses import replace
        # compute_efficiency is the rate of the stack's own modules (fitted on its runs with them); a run that
        # swaps in Transformer Engine's fused modules runs them at the kernel model's rate, as Megatron-Core
        # does (its reference 1.0)
        fused_swap = kernels == "fused" and fw.kernels != "fused"
        fw = replace(fw, kernels=kernels, compute_efficiency=1.0 if fused_swap else fw.compute_efficiency)
    if attention is not None and attention not in ATTENTION_KERNELS:
        raise ConfigError("attention", attention, "one of " + ", ".join(ATTENTION_KERNELS))
    if grad_reduce_dtype is not None and grad_reduce_dtype not in ("bf16", "fp32"):
        raise ConfigError("grad_reduce_dtype", grad_reduce_dtype, "bf16 or fp32")
    if loss is not None and loss not in LOSS_KERNELS:
        raise ConfigError("loss", loss, "one of " + ", ".join(LOSS_KERNELS))
    if activation_offload_layers is not None and (isinstance(activation_offload_layers, bool)
                                                  or not isinstance(activation_offload_layers, int)
                                                  or activation_offload_layers < 1):
        raise ConfigError("activation_offload_layers", activation_offload_layers,
                          "a whole number of blocks >= 1 (None: every block)")
    if fp8_scaling is not None and fp8_scaling not in FP8_SCALINGS:
        raise ConfigError("fp8_scaling", fp8_scaling, "one of " + ", ".join(FP8_SCALINGS))
    if master_weights is not None and master_weights not in MASTER_WEIGHTS:
        raise ConfigError("master_weights", master_weights, "one of " + ", ".join(MASTER_WEIGHTS))
    if master_weights == "remainder" and not fw.capabilities.master_remainders:
        raise ConfigError("master_weights", master_weights, "fp32",
                          message=f"framework {fw.name} cannot run this plan: master_weights=remainder: {fw.name} "
                                  "keeps full fp32 master weights (allowed: fp32)")
    if expandable_segments is not None and not isinstance(expandable_segments, bool):
        raise ConfigError("expandable_segments", expandable_segments, "true or false")
    if not isinstance(fused_norm, bool):
        raise ConfigError("fused_norm", fused_norm, "true or false")
    if recompute_modules is not None:
        recompute_modules = check_recompute_modules(fw, recompute_modules)
    if not isinstance(bf16_optimizer, bool):
        raise ConfigError("bf16_optimizer", bf16_optimizer, "true or false")
    if bf16_optimizer and not fw.capabilities.bf16_optimizer:
        raise ConfigError("bf16_optimizer", True, "false",
                          message=f"framework {fw.name} cannot run this plan: bf16_optimizer: {fw.name} has no "
                                  "BF16_Optimizer (allowed: false)")
    if not isinstance(activation_fp8_input, bool):
        raise ConfigError("activation_fp8_input", activation_fp8_input, "true or false")
    if activation_fp8_input and (not fw.capabilities.activation_fp8_input or fw.kernels != "fused"):
        raise ConfigError("activation_fp8_input", True, "false",
                          message=f"framework {fw.name} cannot run this plan: activation_fp8_input: its "
                                  f"{fw.kernels} MLP keeps the activation input in the compute dtype (Megatron-Core's "
                                  "fused SwiGLU stores it in FP8; allowed: false)")
    if moe_dispatcher is not None and moe_dispatcher not in MOE_DISPATCHERS:
        raise ConfigError("moe_dispatcher", moe_dispatcher, "one of " + ", ".join(MOE_DISPATCHERS))
    if moe_a2a_overlap is not None and not isinstance(moe_a2a_overlap, bool):
        raise ConfigError("moe_a2a_overlap", moe_a2a_overlap, "true or false")
    if not isinstance(moe_fp8_dispatch, bool):
        raise ConfigError("moe_fp8_dispatch", moe_fp8_dispatch, "true or false")
    number = isinstance(moe_imbalance, (int, float)) and not isinstance(moe_imbalance, bool)
    if moe_imbalance is not None and not (number and math.isfinite(moe_imbalance) and 1.0 <= moe_imbalance <= 64.0):
        raise ConfigError("moe_imbalance", moe_imbalance, "a number from 1 (balanced) to 64: the busiest rank's "
                                                          "routed tokens over the mean")
    return Software.of(fw, attention=attention, dropout=bool(dropout), overlap_grad_reduce=overlap_grad_reduce,
                       grad_reduce_dtype=grad_reduce_dtype, loss=loss, tp_comm_overlap=tp_comm_overlap,
                       compile=compile, moe_dispatcher=moe_dispatcher, moe_a2a_overlap=moe_a2a_overlap,
                       moe_imbalance=moe_imbalance, moe_fp8_dispatch=moe_fp8_dispatch, fp8_scaling=fp8_scaling,
                       activation_offload_layers=activation_offload_layers, master_weights=master_weights,
                       expandable_segments=expandable_segments, fused_norm=fused_norm,
                       recompute_modules=recompute_modules, bf16_optimizer=bf16_optimizer,
                       activation_fp8_input=activation_fp8_input)


def check_activation_fp8_input(software: Software, model: TransformerSpec) -> None:
    """ConfigError (one line) when the run stores the activation input in FP8 for a model whose MLP is not SwiGLU:
    Megatron-Core's TransformerConfig refuses it ('Storing activation input in FP8 is supported only for
    SwiGLU', transformer_config.py __post_init__ at core_v0.14.0)."""
    if software.activation_fp8_input and not model.swiglu:
        raise ConfigError("activation_fp8_input", True, "false",
                          message=f"activation_fp8_input needs a SwiGLU MLP: {model.name} uses "
                                  f"{'gated ' if model.gated_mlp else ''}{model.activation} (Megatron-Core stores only "
                                  "the SwiGLU input in FP8; allowed: false)")


def check_recompute_modules(fw: FrameworkProfile, modules) -> tuple[str, ...]:
    """The modules as a tuple, or ConfigError (one line): a non-empty list of distinct names from
    cost_models.blocks.RECOMPUTE_MODULES, on a framework whose capabilities have recompute_modules."""
    from cost_models.blocks import RECOMPUTE_MODULES

    allowed = "a list of distinct names among " + ", ".join(RECOMPUTE_MODULES)
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)) or not modules \
            or any(not isinstance(m, str) or m not in RECOMPUTE_MODULES for m in modules) \
            or len(set(modules)) != len(modules):
        raise ConfigError("recompute_modules", modules, allowed)
    if not fw.capabilities.recompute_modules:
        raise ConfigError("recompute_modules", list(modules), "none",
                          message=f"framework {fw.name} cannot run this plan: recompute_modules={','.join(modules)}: "
                                  f"{fw.name} does not name the modules selective recomputation re-runs (allowed: none)")
    return tuple(modules)


def check_moe_options(model: TransformerSpec, precision: str, *, moe_dispatcher=None, moe_a2a_overlap=None,
                      moe_imbalance=None, moe_fp8_dispatch: bool = False) -> None:
    """ConfigError (one line) when a dense model is given expert-parallel choices (they describe how routed tokens
    reach experts, and a model without experts routes none: a choice silently ignored would read as costed), or
    FP8 dispatch without FP8 training (the dispatched activations are the up-projections' FP8 inputs; DeepSeek-V3
    Sec. 3.3.2; cost_models.moe.dispatch_bytes)."""
    given = {name: value for name, value in (("moe_dispatcher", moe_dispatcher),
                                             ("moe_a2a_overlap", moe_a2a_overlap or None),
                                             ("moe_imbalance", moe_imbalance),
                                             ("moe_fp8_dispatch", moe_fp8_dispatch or None)) if value is not None}
    if given and model.moe is None:
        name, value = next(iter(given.items()))
        raise ConfigError(name, value, "unset for a dense model",
                          message=f"{name} applies to mixture-of-experts models: {model.name} has no experts "
                                  "(allowed: leave it unset)")
    if moe_fp8_dispatch and precision != "fp8":
        raise ConfigError("moe_fp8_dispatch", True, "false",
                          message=f"moe_fp8_dispatch needs precision fp8: the tokens are dispatched as the experts' FP8 "
                                  f"GEMM inputs, and precision {precision} has none (allowed: false)")


def check_master_weights(software: Software, precision: str) -> None:
    """ConfigError unless the master-weight storage works with `precision`: the 16-bit remainder holds the
    low half of an fp32 value whose high half is the parameter, so the parameters must be bf16 (bf16's bits
    are the top 16 of fp32's; fp16's are not), as Apex and Transformer Engine require."""
    if software.bf16_optimizer and precision not in ("amp-bf16", "bf16"):
        raise ConfigError("bf16_optimizer", True, "false",
                          message=f"bf16_optimizer needs bf16 training: precision {precision} "
                                  "(allowed with bf16_optimizer: amp-bf16, bf16)")
    if software.master_weights == "remainder" and precision not in BF16_PARAM_PRECISIONS:
        raise ConfigError("master_weights", "remainder", "fp32",
                          message=f"master_weights=remainder needs bf16 parameters: precision {precision} "
                                  "(allowed with remainder: amp-bf16, bf16, fp8; else master_weights fp32)")


def estimate(model, hw: HardwareProfile | str, cfg: ParallelConfig, *, gpus: int, attention: str | None = None,
             dropout: bool | None = None, overlap_grad_reduce: bool | None = None,
             grad_reduce_dtype: str | None = None, loss: str | None = None, tp_comm_overlap: bool | None = None,
             compile: bool = False, moe_dispatcher: str | None = None,
             moe_a2a_overlap: bool | None = None, moe_imbalance: float | None = None,
             moe_fp8_dispatch: bool = False, kernels: str | None = None, check_framework: bool = True,
             framework_profile: FrameworkProfile | None = None, fp8_scaling: str | None = None,
             activation_offload_layers: int | None = None, master_weights: str | None = None,
             expandable_segments: bool | None = None, fused_norm: bool = False,
             recompute_modules=None, bf16_optimizer: bool = False, activation_fp8_input: bool = False) -> Estimate:
    """Validate `cfg` for `model` on `gpus` devices of `hw` and predict its step time and memory on the
    framework `cfg.framework` names (frameworks/*.json).

    `model` is a TransformerSpec or a MODEL argument (catalog name, config.json path); `hw` a
    HardwareProfile or a profile name/path. `attention`, `dropout`, `overlap_grad_reduce` override
    the framework's defaults (cost_models.step.Software), and so do the expert-parallel choices
    `moe_dispatcher`, `moe_a2a_overlap`, `moe_imbalance`, `moe_fp8_dispatch` (cost_models.moe), the
    block implementation `kernels` (software_for), the FP8 scaling granularity `fp8_scaling` and, with activation
    offload, how many blocks offload (`activation_offload_layers`, Megatron-Core's cpu_offloading_num_layers),
    and how the optimizer keeps the master weights (`master_weights`: fp32, or remainder where the framework
    can, with bf16 parameters; check_master_weights), and whether the allocator runs with expandable segments
    (`expandable_segments`; cost_models.memory.allocator_overhead), and eager RMSNorms fused (`fused_norm`),
    and the modules selective recomputation re-runs (`recompute_modules`, Megatron-Core's; with recompute=selective).
    `check_framework=False` costs a plan the framework's
    capabilities do not list (the executor's own runs: it is a torchtitan-style stack that also runs
    tensor parallelism without sequence parallelism and ZeRO-1). `framework_profile` replaces the shipped
    profile of `cfg.framework` (a calibration's trial values).

    A configuration that does not fit in memory is still evaluated (`fits` False). Raises
    ConfigError for degrees that do not multiply to `gpus`, tp not dividing the heads, more
    pipeline chunks than blocks, ep > 1 on a dense model or not dividing the experts, stages not summing
    to the blocks, or a plan the framework cannot run (frameworks.rules.violations).
    """
    if isinstance(hw, str):
        hw = load_profile(hw)
    if isinstance(model, str):
        from planner.sources import resolve_model
        model = resolve_model(model, seq=cfg.seq)
    if not isinstance(model, TransformerSpec):
        from planner.sources import transformer_spec
        model = transformer_spec(model)
    if framework_profile is not None and framework_profile.name != cfg.framework:
        raise ConfigError("framework_profile", framework_profile.name, f"the profile of the plan's framework ({cfg.framework})")
    attention, dropout, from_config = config_defaults(model, attention=attention, dropout=dropout)
    software = software_for(framework_profile or cfg.framework, attention=attention, dropout=dropout,
                            overlap_grad_reduce=overlap_grad_reduce, grad_reduce_dtype=grad_reduce_dtype, loss=loss,
                            tp_comm_overlap=tp_comm_overlap, compile=compile,
                            moe_dispatcher=moe_dispatcher, moe_a2a_overlap=moe_a2a_overlap,
                            moe_imbalance=moe_imbalance, moe_fp8_dispatch=moe_fp8_dispatch, kernels=kernels,
                            fp8_scaling=fp8_scaling, activation_offload_layers=activation_offload_layers,
                            master_weights=master_weights, expandable_segments=expandable_segments,
                            fused_norm=fused_norm, recompute_modules=recompute_modules,
                            bf16_optimizer=bf16_optimizer, activation_fp8_input=activation_fp8_input)
    check_activation_fp8_input(software, model)
    check_moe_options(model, cfg.precision, moe_dispatcher=moe_dispatcher, moe_a2a_overlap=moe_a2a_overlap,
                      moe_imbalance=moe_imbalance, moe_fp8_dispatch=moe_fp8_dispatch)
    cfg.check_world_size(gpus)
    cfg.check_model(heads=model.heads, kv_heads=model.n_kv_heads, blocks=model.total_blocks)
    cfg.check_experts(model.moe)
    cfg.check_sequence(model.seq if cfg.seq is None else cfg.seq, heads=model.heads, kv_heads=model.n_kv_heads)
    resolve_precision(hw, cfg.precision)
    check_master_weights(software, cfg.precision)
    if software.bf16_optimizer and cfg.offloads("optimizer"):
        raise ConfigError("bf16_optimizer", True, "false",
                          message=f"bf16_optimizer runs on the device: offload={cfg.offload} (DeepSpeed uses its "
                                  "ZeRO optimizer when the optimizer is offloaded; allowed with bf16_optimizer: "
                                  "offload none or activations)")
    if software.bf16_optimizer and cfg.zero != 1:
        raise ConfigError("zero", cfg.zero, "1",
                          message=f"bf16_optimizer shards only the optimizer states, as ZeRO-1: zero={cfg.zero} "
                                  "(allowed with bf16_optimizer: 1)")
    if check_framework:
        check_runnable(software.framework, cfg)
        check_model_runnable(software.framework, model, cfg)
        check_moe_runnable(software.framework, software, model, cfg)
    if cfg.stages and (min(cfg.stages) < 0 or min(cfg.stages[1:-1] or (1,)) < 1
                       or (len(cfg.stages) == 1 and cfg.stages[0] < 1)):
        raise ConfigError("stages", list(cfg.stages), "at least one block per stage (the first and the last may "
                                                      "hold none: the embedding or the loss alone, Megatron's "
                                                      "account-for-embedding/loss layouts)")
    scores = score(model, hw, candidate_of(cfg, model.total_blocks), global_batch=cfg.global_batch, seq=cfg.seq,
                   precision=cfg.precision, optimizer=cfg.optimizer, software=software)
    if STEP_MODEL == "timeline":
        scores = timeline_scores(scores)
    return Estimate(model=model, hardware=hw, config=cfg, gpus=gpus, software=software, scores=scores,
                    from_config=from_config)


def config_defaults(model: TransformerSpec, *, attention: str | None, dropout: bool | None):
    """(attention, dropout, names taken from the config): what the caller left unset (None) and the model's
    config says (planner.hf_config.training_defaults: dropout active when a probability is above 0, the
    recorded attn_implementation); the framework's defaults apply to the rest."""
    extras = dict(model.extras)
    taken = []
    if dropout is None and "dropout" in extras:
        dropout = float(extras["dropout"]) > 0.0
        taken.append("dropout")
    if attention is None and "attention" in extras:
        attention = str(extras["attention"])
        taken.append("attention")
    return attention, dropout, tuple(taken)


class _CallableModule(types.ModuleType):
    """`planner.estimate(...)` (docs/cli-contract.md, Python API) works although importing this module
    makes `planner.estimate` the module: calling the module calls `estimate`."""

    def __call__(self, *args, **kwargs) -> Estimate:
        return estimate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
