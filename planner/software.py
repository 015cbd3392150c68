"""The run's software: the framework profile with the run's options (planner.run_options.RunOptions)
checked against it, against the model and the precision, and its defaults applied
(cost_models.step.Software.of). estimate(), the search, the profiler and score() all resolve a run's
software here.
"""

from __future__ import annotations

import math
from dataclasses import replace

from cost_models.blocks import BLOCK_SCALED_SCALINGS, RECOMPUTE_MODULES
from cost_models.comm import tp_overlapped
from cost_models.compute import linear_gemm_precision
from cost_models.step import BF16_PARAM_PRECISIONS, MASTER_WEIGHTS, Software
from frameworks import (
    ATTENTION_KERNELS,
    FP8_SCALINGS,
    SWITCHES_A_STACK_MAY_LACK,
    KERNELS,
    LOSS_KERNELS,
    MOE_DISPATCHERS,
    FrameworkProfile,
    load_framework,
)
from frameworks.rules import a2a_overlap_runs, fp8_scaling_problem
from planner.errors import ConfigError
from planner.run_options import GRAD_REDUCE_BYTES, RunOptions
from planner.spec import TransformerSpec


def software_for(framework: str | FrameworkProfile, options: RunOptions | None = None) -> Software:
    """The run's software: the framework profile (by name or record) with the run's `options` checked
    against it and its defaults applied (cost_models.step.Software.of). A run that swaps the stack's
    modules for another's (`options.kernels`, frameworks.KERNELS: NeMo AutoModel runs FSDP2 + DTensor
    like torchtitan with Transformer Engine's fused modules) gets that block implementation."""
    options = options or RunOptions()
    fw = framework if isinstance(framework, FrameworkProfile) else load_framework(framework)
    fw = _with_kernels(fw, options.kernels)
    _check_values(options)
    _check_runnable_options(fw, options)
    if options.recompute_modules is not None:
        options = options.with_(
            recompute_modules=check_recompute_modules(fw, options.recompute_modules)
        )
    return Software.of(fw, options)


FREE_OVERLAPS = ("tp_comm_overlap", "moe_a2a_overlap")
"""Overlap options recommend chooses per plan when the user leaves them unset (`free_overlaps`)."""

MEMORY_OVERLAPS = ("tp_comm_overlap",)
"""The free overlaps that cost memory (tp_comm_overlap's userbuffers, cost_models.memory.
userbuffer_bytes): off where on the plan does not fit. moe_a2a_overlap costs none the model counts
(cost_models.moe.ep_block_seconds) and stays on wherever the plan runs it."""


def free_overlaps(
    software: Software, options: RunOptions, model=None, *, precision: str
) -> tuple[str, ...]:
    """The overlap options that are the user's free choice, for recommend to choose per plan: left
    unset (None), off by the framework's default, and runnable by the framework. tp_comm_overlap:
    the capability, and Transformer Engine's modules (userbuffers) or torch.compile (torchtitan's
    async TP is an Inductor pass: 'Async TP requires torch.compile', torchtitan parallelize.py).
    moe_a2a_overlap: the capability (Megatron-Core's --overlap-moe-expert-parallel-comm) and a
    mixture-of-experts `model`. Not tp_comm_overlap under nvfp4: the stack's NVFP4 presets run
    without userbuffers (Megatron-Bridge's Llama scripts force tp_comm_overlap off for nvfp4,
    scripts/performance/configs/llama/llama3_llm_pretrain.py at v0.3.0) and no NVFP4 run with them
    is published; the user may still turn it on. The recipe counts only where `precision` runs it
    (compute.linear_gemm_precision): beside bf16 training an nvfp4 recipe quantizes nothing."""
    fw = software.framework
    tp_free = (
        options.tp_comm_overlap is None
        and not software.tp_comm_overlap
        and fw.capabilities.tp_comm_overlap
        and (fw.kernels == "fused" or software.compile)
        and linear_gemm_precision(precision, software.fp8_scaling) != "nvfp4"
    )
    a2a_free = (
        getattr(model, "moe", None) is not None
        and options.moe_a2a_overlap is None
        and not software.moe_a2a_overlap
        and fw.capabilities.moe_a2a_overlap
    )
    return (("tp_comm_overlap",) if tp_free else ()) + (("moe_a2a_overlap",) if a2a_free else ())


def plan_options(options: RunOptions, free: tuple[str, ...], cfg, model) -> RunOptions:
    """One plan's run options: `options` with each free overlap (`free_overlaps`) on where the plan
    `cfg` of `model` can run it (tp_comm_overlap: cost_models.comm.tp_overlapped; moe_a2a_overlap:
    a mixture-of-experts model and frameworks.rules.a2a_overlap_runs)."""
    on = {}
    if "tp_comm_overlap" in free and bool(tp_overlapped(True, cfg.tp, cfg.sequence_parallel)):
        on["tp_comm_overlap"] = True
    if "moe_a2a_overlap" in free and getattr(model, "moe", None) is not None:
        runs = a2a_overlap_runs(
            ep=cfg.ep,
            pp=cfg.pp,
            virtual_stages=cfg.virtual_stages,
            full_recompute=cfg.recompute == "full",
            precision=cfg.precision,
            recompute_modules=options.recompute_modules or (),
            mtp_modules=getattr(model, "mtp_modules", 0),
        )
        if bool(runs):
            on["moe_a2a_overlap"] = True
    return options.with_(**on) if on else options


def _with_kernels(fw: FrameworkProfile, kernels: str | None) -> FrameworkProfile:
    """`fw` running `kernels`' block implementation. compute_efficiency is the rate of the stack's own
    modules (fitted on its runs with them); a run that swaps in Transformer Engine's fused modules runs
    them at the kernel model's rate, as Megatron-Core does (its reference 1.0)."""
    if kernels is None:
        return fw
    if kernels not in KERNELS:
        raise ConfigError("kernels", kernels, "one of " + ", ".join(KERNELS))
    fused_swap = kernels == "fused" and fw.kernels != "fused"
    return replace(
        fw, kernels=kernels, compute_efficiency=1.0 if fused_swap else fw.compute_efficiency
    )


def _check_choice(name: str, value, allowed) -> None:
    if value is not None and value not in allowed:
        raise ConfigError(name, value, "one of " + ", ".join(allowed))


def _check_switch(name: str, value, *, optional: bool = False) -> None:
    if not isinstance(value, bool) and not (optional and value is None):
        raise ConfigError(name, value, "true or false")


def _check_values(o: RunOptions) -> None:
    """ConfigError (one line) for a value no framework takes."""
    _check_choice("attention", o.attention, ATTENTION_KERNELS)
    _check_choice("grad_reduce_dtype", o.grad_reduce_dtype, tuple(GRAD_REDUCE_BYTES))
    _check_choice("loss", o.loss, LOSS_KERNELS)
    layers = o.activation_offload_layers
    if layers is not None and (
        isinstance(layers, bool) or not isinstance(layers, int) or layers < 1
    ):
        raise ConfigError(
            "activation_offload_layers", layers, "a whole number of blocks >= 1 (None: every block)"
        )
    _check_choice("fp8_scaling", o.fp8_scaling, FP8_SCALINGS)
    _check_choice("master_weights", o.master_weights, MASTER_WEIGHTS)
    _check_switch("expandable_segments", o.expandable_segments, optional=True)
    _check_switch("fused_norm", o.fused_norm)
    _check_switch("bf16_optimizer", o.bf16_optimizer)
    _check_switch("activation_fp8_input", o.activation_fp8_input)
    metrics = o.train_metrics
    if metrics is not None and (
        isinstance(metrics, bool) or not isinstance(metrics, int) or not 0 <= metrics <= 8
    ):
        raise ConfigError(
            "train_metrics",
            metrics,
            "a whole number from 0 to 8 (cross-entropy metrics over each micro-batch's logits; "
            "Composer / llm-foundry: 2)",
        )
    _check_choice("moe_dispatcher", o.moe_dispatcher, MOE_DISPATCHERS)
    _check_switch("moe_a2a_overlap", o.moe_a2a_overlap, optional=True)
    _check_switch("moe_fp8_dispatch", o.moe_fp8_dispatch)
    imbalance = o.moe_imbalance
    number = isinstance(imbalance, (int, float)) and not isinstance(imbalance, bool)
    if imbalance is not None and not (
        number and math.isfinite(imbalance) and 1.0 <= imbalance <= 64.0
    ):
        raise ConfigError(
            "moe_imbalance",
            imbalance,
            "a number from 1 (balanced) to 64: the busiest rank's routed tokens over the mean",
        )


def _check_runnable_options(fw: FrameworkProfile, o: RunOptions) -> None:
    """ConfigError (one line) for an option the framework `fw` cannot run."""
    kernels = fw.capabilities.attention_kernels
    if o.attention is not None and o.attention not in kernels:
        raise ConfigError(
            "attention",
            o.attention,
            "one of " + ", ".join(kernels),
            message=f"framework {fw.name} cannot run this plan: attention={o.attention}: "
            f"{fw.name} runs {', '.join(kernels)}",
        )
    if o.master_weights == "remainder" and not fw.capabilities.master_remainders:
        raise ConfigError(
            "master_weights",
            o.master_weights,
            "fp32",
            message=f"framework {fw.name} cannot run this plan: master_weights=remainder: "
            f"{fw.name} keeps full fp32 master weights (allowed: fp32)",
        )
    for option, lacking in SWITCHES_A_STACK_MAY_LACK.items():
        if getattr(o, option) and not getattr(fw.capabilities, option):
            raise ConfigError(
                option,
                True,
                "false",
                message=f"framework {fw.name} cannot run this plan: {option}: {fw.name} "
                f"{lacking} (allowed: false)",
            )
    if o.activation_fp8_input and (
        not fw.capabilities.activation_fp8_input or fw.kernels != "fused"
    ):
        raise ConfigError(
            "activation_fp8_input",
            True,
            "false",
            message=f"framework {fw.name} cannot run this plan: activation_fp8_input: its "
            f"{fw.kernels} MLP keeps the activation input in the compute dtype "
            "(Megatron-Core's fused SwiGLU stores it in FP8; allowed: false)",
        )
    problem = fp8_scaling_problem(fw, o.fp8_scaling)
    if problem:
        allowed = ", ".join(fw.capabilities.fp8_scalings)
        raise ConfigError(
            "fp8_scaling",
            o.fp8_scaling,
            allowed,
            message=f"framework {fw.name} cannot run this plan: {problem} (allowed: {allowed})",
        )


def check_activation_fp8_input(software: Software, model: TransformerSpec) -> None:
    """ConfigError (one line) when the run stores the activation input in FP8 for a model whose MLP is not SwiGLU:
    Megatron-Core's TransformerConfig refuses it ('Storing activation input in FP8 is supported only for
    SwiGLU', transformer_config.py __post_init__ at core_v0.14.0)."""
    if software.activation_fp8_input and not model.swiglu:
        raise ConfigError(
            "activation_fp8_input",
            True,
            "false",
            message=f"activation_fp8_input needs a SwiGLU MLP: {model.name} uses "
            f"{'gated ' if model.gated_mlp else ''}{model.activation} (Megatron-Core stores only "
            "the SwiGLU input in FP8; allowed: false)",
        )


def check_recompute_modules(fw: FrameworkProfile, modules) -> tuple[str, ...]:
    """The modules as a tuple, or ConfigError (one line): a non-empty list of distinct names from
    cost_models.blocks.RECOMPUTE_MODULES, on a framework whose capabilities have recompute_modules."""
    allowed = "a list of distinct names among " + ", ".join(RECOMPUTE_MODULES)
    if (
        isinstance(modules, str)
        or not isinstance(modules, (list, tuple))
        or not modules
        or any(not isinstance(m, str) or m not in RECOMPUTE_MODULES for m in modules)
        or len(set(modules)) != len(modules)
    ):
        raise ConfigError("recompute_modules", modules, allowed)
    if not fw.capabilities.recompute_modules:
        raise ConfigError(
            "recompute_modules",
            list(modules),
            "none",
            message=f"framework {fw.name} cannot run this plan: recompute_modules={','.join(modules)}: "
            f"{fw.name} does not name the modules selective recomputation re-runs (allowed: none)",
        )
    return tuple(modules)


def check_moe_options(model: TransformerSpec, precision: str, options: RunOptions) -> None:
    """ConfigError (one line) when a dense model is given expert-parallel choices (they describe how routed tokens
    reach experts, and a model without experts routes none: a choice silently ignored would read as costed), or
    FP8 dispatch without FP8 training (the dispatched activations are the up-projections' FP8 inputs; DeepSeek-V3
    Sec. 3.3.2; cost_models.moe.dispatch_bytes)."""
    given = {
        name: value
        for name, value in options.moe_choices().items()
        if value is not None and value is not False
    }
    if given and model.moe is None:
        name, value = next(iter(given.items()))
        raise ConfigError(
            name,
            value,
            "unset for a dense model",
            message=f"{name} applies to mixture-of-experts models: {model.name} has no experts "
            "(allowed: leave it unset)",
        )
    if options.moe_fp8_dispatch and precision != "fp8":
        raise ConfigError(
            "moe_fp8_dispatch",
            True,
            "false",
            message=f"moe_fp8_dispatch needs precision fp8: the tokens are dispatched as the experts' FP8 "
            f"GEMM inputs, and precision {precision} has none (allowed: false)",
        )


_TENSOR_CORES_NEEDED = {
    "mxfp8": "block-scaled FP8 tensor cores",
    "nvfp4": "FP4 tensor cores with E4M3 block scales",
}
BLOCK_SCALED_RECIPES = {recipe: _TENSOR_CORES_NEEDED[recipe] for recipe in BLOCK_SCALED_SCALINGS}
"""The recipes that need tensor cores of their own (cost_models.blocks.BLOCK_SCALED_SCALINGS),
stated by a profile as peak_tflops[recipe]: MXFP8's 32-element E8M0 blocks and NVFP4's 16-element
E4M3 blocks run on Blackwell's block-scaled MMA; Hopper's FP8 tensor cores take one scale per
operand and have no FP4."""


def check_fp8_scaling_hardware(software: Software, hw, precision: str) -> None:
    """ConfigError when the run's FP8 recipe needs tensor cores `hw` lacks
    (BLOCK_SCALED_RECIPES)."""
    recipe = software.fp8_scaling
    if precision != "fp8" or recipe not in BLOCK_SCALED_RECIPES or recipe in hw.peak_tflops:
        return
    others = [
        s
        for s in software.framework.capabilities.fp8_scalings
        if s not in BLOCK_SCALED_RECIPES or s in hw.peak_tflops
    ]
    raise ConfigError(
        "fp8_scaling",
        recipe,
        ", ".join(others),
        message=f"fp8_scaling={recipe} needs {BLOCK_SCALED_RECIPES[recipe]} "
        f"(peak_tflops.{recipe}), which {hw.name} ({hw.device}) does not have; "
        f"allowed here: {', '.join(others)}",
    )


def check_master_weights(software: Software, precision: str) -> None:
    """ConfigError unless the master-weight storage works with `precision`: the 16-bit remainder holds the
    low half of an fp32 value whose high half is the parameter, so the parameters must be bf16 (bf16's bits
    are the top 16 of fp32's; fp16's are not), as Apex and Transformer Engine require."""
    if software.bf16_optimizer and precision not in ("amp-bf16", "bf16"):
        raise ConfigError(
            "bf16_optimizer",
            True,
            "false",
            message=f"bf16_optimizer needs bf16 training: precision {precision} "
            "(allowed with bf16_optimizer: amp-bf16, bf16)",
        )
    if software.master_weights == "remainder" and precision not in BF16_PARAM_PRECISIONS:
        raise ConfigError(
            "master_weights",
            "remainder",
            "fp32",
            message=f"master_weights=remainder needs bf16 parameters: precision {precision} "
            "(allowed with remainder: amp-bf16, bf16, fp8; else master_weights fp32)",
        )
