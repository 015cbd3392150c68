"""Evaluate one given configuration: validate it, score it with the vectorized model (arrays of
length one, so the scalar and the search can never disagree) and build the plan document
(docs/cli-contract.md, "JSON documents").
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cost_models import params as P
from cost_models.step import Software
from frameworks import FrameworkProfile
from frameworks.rules import check_model_runnable, check_moe_runnable, check_runnable
from cost_models.compute import peak_flops
from hardware_profiles import HardwareProfile, load_profile
from planner.errors import ConfigError
from planner.option_rules import check_options, fp8_switches
from cost_models.compute import resolve_precision
from planner.parallel import CP_COMMS, OFFLOAD, RECOMPUTE, SCHEDULES, ParallelConfig
from planner.placement import placement_index
from planner.run_options import RunOptions
from planner.software import (
    check_activation_fp8_input,
    check_fp8_scaling_hardware,
    check_master_weights,
    check_moe_options,
    software_for,
)
from planner.score import CandidateArrays, Scores, score, timeline_scores
from planner.spec import TransformerSpec
from planner.partition import even_split
from planner.sources import resolve_model, transformer_spec
from cost_models.compute import block_seconds
from cost_models.moe import placement_summary
from cost_models.step import Step

STEP_MODEL = "timeline"
"""What estimate() reads the step time off: "timeline" (the simulated step, cost_models.timeline;
the search's closed form stays its bound and ranking) or "closed" (planner.score's closed form)."""


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
        return {k: self._x(k) for k in Scores.BREAKDOWN} | {
            "recompute_part_of_compute": self._x("recompute")
        }

    def memory(self) -> dict:
        return {
            "peak_bytes_per_gpu": self.peak_bytes_per_gpu,
            "capacity_bytes": int(self.hardware.memory_bytes),
            "fits": self.fits,
            "needed_bytes": self.needed_bytes,
            "margin_bytes": int(self.hardware.memory_bytes) - self.needed_bytes,
            **{
                k: int(round(self._x(k)))
                for k in (
                    "params_bytes",
                    "grads_bytes",
                    "optimizer_bytes",
                    "activations_bytes",
                    "other_bytes",
                    "saved_activations_bytes",
                )
            },
        }

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
        plan["stages"] = list(cfg.stages) or even_stages(
            spec.total_blocks, cfg.pp * cfg.virtual_stages
        )
        sw = self.software
        return {
            "schema_version": "1",
            "model": {
                "name": spec.name,
                "params": self.params,
                "layers": spec.layers,
                "hidden": spec.hidden,
                "heads": spec.heads,
                "kv_heads": spec.n_kv_heads,
                "ffn": spec.d_ffn,
                "vocab": spec.vocab,
                "seq": cfg.seq,
                "arch": arch_of(spec),
            },
            "hardware": {
                "name": self.hardware.name,
                "gpus": self.gpus,
                "nodes": self.nodes,
                "device": self.hardware.device,
                "devices_per_node": self.hardware.devices_per_node,
                "memory_bytes": int(self.hardware.memory_bytes),
            },
            "plan": plan,
            "software": software_block(sw, cfg.precision, spec, self.from_config),
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

        cfg = self.config
        x = getattr(self.scores, "step", None)  # the record score() costed the plan with
        if x is None:
            x = Step.of(
                self.model,
                self.hardware,
                self.software,
                candidate_of(cfg, self.model.total_blocks),
                global_batch=cfg.global_batch,
                seq=cfg.seq,
                precision=cfg.precision,
                optimizer=cfg.optimizer,
            )
        return placement_summary(x, block_seconds(x))


def arch_of(spec: TransformerSpec) -> dict:
    """Every shape field of the spec (planner.spec.TransformerSpec), so that a plan file describes the
    model completely (exports write a framework's model arguments from it)."""
    from dataclasses import asdict

    return {k: v for k, v in asdict(spec).items() if k not in ("name", "extras")}


def even_stages(blocks: int, chunks: int) -> list[int]:
    """Blocks per chunk as even as possible (the first chunks take the remainder; planner.partition.even_split)."""
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
        dp=one(cfg.dp),
        tp=one(cfg.tp),
        pp=one(cfg.pp),
        micro_batch=one(cfg.micro_batch),
        virtual_stages=one(cfg.virtual_stages),
        zero=one(cfg.zero),
        recompute=one(RECOMPUTE.index(cfg.recompute)),
        offload=one(OFFLOAD.index(cfg.offload)),
        sequence_parallel=one(cfg.sequence_parallel),
        schedule=one(SCHEDULES.index(cfg.schedule)),
        placement=one(placement_index(cfg.placement)),
        cp=one(cfg.cp),
        cp_comm=one(CP_COMMS.index(cfg.cp_comm)),
        dp_shard=one(cfg.dp_shard),
        ep=one(cfg.ep),
        expert_tp=one(cfg.expert_tp),
        recompute_layers=one(cfg.recompute_layers or 0),
        blocks_first=one(per_rank[0]),
        blocks_last=one(per_rank[-1]),
        blocks_max=one(max(per_rank)),
        rank_blocks=np.asarray([per_rank]),
        rank_recomputed=None
        if cfg.recompute_layers is None
        else np.asarray([rank_recomputed(chunks, cfg.pp, cfg.recompute_layers)]),
    )


def estimate(
    model,
    hw: HardwareProfile | str,
    cfg: ParallelConfig,
    *,
    gpus: int,
    options: RunOptions | None = None,
    check_framework: bool = True,
    framework_profile: FrameworkProfile | None = None,
) -> Estimate:
    """Validate `cfg` for `model` on `gpus` devices of `hw` and predict its step time and memory on the
    framework `cfg.framework` names (frameworks/*.json), run with `options` (planner.run_options.RunOptions:
    the attention kernel, dropout, overlaps, loss kernel, FP8 scaling, master weights, MoE dispatch, ...;
    None or an unset field: the model's config, else the framework's default).

    `model` is a TransformerSpec or a MODEL argument (catalog name, config.json path); `hw` a
    HardwareProfile or a profile name/path. `check_framework=False` costs a plan the framework's
    capabilities do not list (the executor's own runs: it is a torchtitan-style stack that also runs
    tensor parallelism without sequence parallelism and ZeRO-1). `framework_profile` replaces the shipped
    profile of `cfg.framework` (a calibration's trial values).

    A configuration that does not fit in memory is still evaluated (`fits` False). Raises
    ConfigError for degrees that do not multiply to `gpus`, tp not dividing the heads, more
    pipeline chunks than blocks, ep > 1 on a dense model or not dividing the experts, stages not summing
    to the blocks, or a plan the framework cannot run (frameworks.rules.violations).
    """
    options = options or RunOptions()
    model, hw = _resolve_inputs(model, hw, cfg, framework_profile)
    attention, dropout, from_config = config_defaults(
        model, attention=options.attention, dropout=options.dropout
    )
    software = software_for(
        framework_profile or cfg.framework, options.with_(attention=attention, dropout=dropout)
    )
    check_activation_fp8_input(software, model)
    check_moe_options(model, cfg.precision, options)
    # the one rule (planner.option_rules), for the Python API as for the commands
    check_options(**fp8_switches(options), precision=cfg.precision)
    cfg.check_world_size(gpus)
    cfg.check_against(model, cfg.seq)
    resolve_precision(hw, cfg.precision)
    check_master_weights(software, cfg.precision)
    check_fp8_scaling_hardware(software, hw, cfg.precision)
    _check_bf16_optimizer(software, cfg)
    _check_fp8_param_gather(options, cfg)
    if check_framework:
        check_runnable(software.framework, cfg)
        check_model_runnable(software.framework, model, cfg)
        check_moe_runnable(software.framework, software, model, cfg)
    _check_stage_sizes(cfg)
    scores = score(
        model,
        hw,
        candidate_of(cfg, model.total_blocks),
        global_batch=cfg.global_batch,
        seq=cfg.seq,
        precision=cfg.precision,
        optimizer=cfg.optimizer,
        software=software,
    )
    if STEP_MODEL == "timeline":
        scores = timeline_scores(scores)
    return Estimate(
        model=model,
        hardware=hw,
        config=cfg,
        gpus=gpus,
        software=software,
        scores=scores,
        from_config=from_config,
    )


def _resolve_inputs(
    model, hw: HardwareProfile | str, cfg: ParallelConfig, framework_profile
) -> tuple[TransformerSpec, HardwareProfile]:
    """The model as a TransformerSpec and the hardware profile; a framework_profile of another
    framework than the plan's refused."""
    if isinstance(hw, str):
        hw = load_profile(hw)
    if isinstance(model, str):
        model = resolve_model(model, seq=cfg.seq)
    if not isinstance(model, TransformerSpec):
        model = transformer_spec(model)
    if framework_profile is not None and framework_profile.name != cfg.framework:
        raise ConfigError(
            "framework_profile",
            framework_profile.name,
            f"the profile of the plan's framework ({cfg.framework})",
        )
    return model, hw


def _check_fp8_param_gather(options: RunOptions, cfg: ParallelConfig) -> None:
    """FP8 parameter all-gathers, asked for, need parameters gathered: ZeRO >= 1 (Megatron-LM
    asserts --use-distributed-optimizer with --fp8-param-gather, arguments.py validate_args; a
    framework's default applies only where they are, Software.gathers_fp8)."""
    if options.fp8_param_gather and cfg.zero < 1:
        raise ConfigError(
            "zero",
            cfg.zero,
            "1 to 3 with fp8_param_gather",
            message=f"fp8_param_gather gathers parameters in FP8, and zero={cfg.zero} gathers none "
            "(Megatron-LM needs its distributed optimizer; allowed with fp8_param_gather: zero 1 "
            "to 3)",
        )


def _check_bf16_optimizer(software, cfg: ParallelConfig) -> None:
    """DeepSpeed's BF16_Optimizer: on the device (no optimizer offload), with ZeRO-1."""
    if software.bf16_optimizer and cfg.offloads("optimizer"):
        raise ConfigError(
            "bf16_optimizer",
            True,
            "false",
            message=f"bf16_optimizer runs on the device: offload={cfg.offload} (DeepSpeed uses its "
            "ZeRO optimizer when the optimizer is offloaded; allowed with bf16_optimizer: "
            "offload none or activations)",
        )
    if software.bf16_optimizer and cfg.zero != 1:
        raise ConfigError(
            "zero",
            cfg.zero,
            "1",
            message=f"bf16_optimizer shards only the optimizer states, as ZeRO-1: zero={cfg.zero} "
            "(allowed with bf16_optimizer: 1)",
        )


def _check_stage_sizes(cfg: ParallelConfig) -> None:
    """At least one block per stage; the first and the last may hold none."""
    if cfg.stages and (
        min(cfg.stages) < 0
        or min(cfg.stages[1:-1] or (1,)) < 1
        or (len(cfg.stages) == 1 and cfg.stages[0] < 1)
    ):
        raise ConfigError(
            "stages",
            list(cfg.stages),
            "at least one block per stage (the first and the last may "
            "hold none: the embedding or the loss alone, Megatron's "
            "account-for-embedding/loss layouts)",
        )


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


_NOT_IN_THE_BLOCK = ("framework", "grad_reduce_dtype")
"""Software fields the block writes otherwise: the framework by name, the gradient dtype as the
bytes its gradients take (grad_reduce_bytes, the framework's default included)."""


def written_options() -> tuple[str, ...]:
    """The run options a software block records by name (every Software field but
    _NOT_IN_THE_BLOCK's)."""
    return tuple(f.name for f in fields(Software) if f.name not in _NOT_IN_THE_BLOCK)


def software_block(
    sw: Software, precision: str, spec: TransformerSpec, from_config=()
) -> dict[str, Any]:
    """A plan document's `software` block: the stack, then every option the run was costed with
    (cost_models.step.Software, the framework's defaults applied) that applies to it: `moe_*`
    only for a mixture-of-experts model, `fp8_*` only under FP8; unset ones (None) left out.
    planner.plan.run_options reads it back."""
    block: dict[str, Any] = {
        "framework": sw.framework.name,
        "kernels": sw.framework.kernels,
        "from_config": list(from_config),
        "grad_reduce_bytes": sw.state_bytes(precision).reduce,
    }
    for option in fields(sw):
        value = getattr(sw, option.name)
        if option.name in _NOT_IN_THE_BLOCK or value is None:
            continue
        if option.name.startswith("moe_") and spec.moe is None:
            continue
        if option.name.startswith("fp8_") and precision != "fp8":
            continue
        block[option.name] = list(value) if isinstance(value, tuple) else value
    return block
