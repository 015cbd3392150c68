"""Arguments shared by commands (docs/cli-contract.md, 'Arguments shared by commands'), declared once."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

import typer

from planner.run_options import RunOptions
from planner.io import dumps_strict

MAX_WORLD_SIZE = 2**20
"""Largest --gpus (and --nodes, --dp/--tp/--pp): 64 x the 16,384 H100 GPUs that trained Llama 3 405B
(Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3); beyond it the search's divisor
enumeration only burns time."""
MAX_SEQ = 2**24
"""Largest --seq, in tokens: above the 10M-token context of Llama 4 Scout (Meta, "The Llama 4 herd",
2025), the longest of a released model."""
MAX_GLOBAL_BATCH = 2**24
"""Largest --global-batch / --micro-batch, in sequences: thousands of times the published batches
(GPT-3: 1,536 sequences of 2,048 tokens, Brown et al. 2020, Table 2.1; Llama 3 405B: 16M tokens,
Dubey et al. 2024, Sec. 3.4)."""
MAX_TOKENS = 1e16
"""Largest --tokens: about 600 x the 15.6T tokens Llama 3 was trained on (Dubey et
al. 2024, Sec. 3.1); larger counts overflow nothing but mean nothing either."""

ModelArg = Annotated[
    str,
    typer.Argument(
        help="Catalog name (e.g. gpt3-175b), a Hugging Face config.json path, or package.module:factory."
    ),
]
HardwareOpt = Annotated[
    str,
    typer.Option(
        "--hardware", help="Profile name in hardware_profiles/ or a path to a profile file."
    ),
]
GpusOpt = Annotated[
    Optional[int],
    typer.Option("--gpus", min=1, max=MAX_WORLD_SIZE, help="World size (total devices)."),
]
NodesOpt = Annotated[
    Optional[int],
    typer.Option(
        "--nodes", min=1, max=MAX_WORLD_SIZE, help="Nodes; world size = nodes x devices per node."
    ),
]
SeqOpt = Annotated[
    Optional[int],
    typer.Option("--seq", min=1, max=MAX_SEQ, help="Sequence length (default: the model's)."),
]
GlobalBatchOpt = Annotated[
    Optional[int],
    typer.Option(
        "--global-batch", min=1, max=MAX_GLOBAL_BATCH, help="Sequences per optimizer step."
    ),
]
MicroBatchOpt = Annotated[
    Optional[int],
    typer.Option("--micro-batch", min=1, max=MAX_GLOBAL_BATCH, help="Sequences per micro-batch."),
]
PrecisionOpt = Annotated[
    str, typer.Option("--precision", help="fp32, amp-bf16, amp-fp16, bf16 or fp8.")
]
HwPrecisionOpt = Annotated[
    Optional[str],
    typer.Option(
        "--precision",
        help="fp32, amp-bf16, amp-fp16, bf16 or fp8 (FP8 GEMMs, BF16 elsewhere; devices with FP8 only) "
        "(default: amp-bf16, or amp-fp16 on devices without bf16).",
    ),
]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="adamw or sgd.")]
FrameworkOpt = Annotated[
    Optional[str],
    typer.Option(
        "--framework",
        help="Software stack the plan runs on: megatron (Megatron-LM / NeMo), torchtitan, fsdp (plain "
        "PyTorch DDP/FSDP with Hugging Face or plain modules) or deepspeed (default: a plan file's own; fsdp for a "
        "config.json or module factory; megatron for a catalog name).",
    ),
]
AttentionOpt = Annotated[
    Optional[str],
    typer.Option(
        "--attention",
        help="Attention kernel: fused (FlashAttention-3 / cuDNN), flash (FlashAttention-2), flash1 "
        "(FlashAttention-1), sdpa, triton or unfused (default: the model's config, else the "
        "framework's).",
    ),
]
DropoutOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--dropout/--no-dropout",
        help="Dropout layers active (default: the model's config, else off).",
    ),
]
GradReduceOpt = Annotated[
    Optional[str],
    typer.Option(
        "--grad-reduce-dtype",
        help="Dtype gradients are kept and reduced in: bf16 (NVIDIA's NeMo and Megatron-Bridge "
        "recipes; megatron's default with bf16 and FP8) or fp32 (Megatron-LM's --bf16) (default: "
        "the framework's).",
    ),
]
KernelsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kernels",
        help="The block implementation the run uses when it is not the framework's own: fused "
        "(Transformer Engine / Megatron kernels), eager (Hugging Face modules, e.g. under "
        "DeepSpeed ZeRO-3 or Accelerate) or torch (plain PyTorch modules). Default: the "
        "framework's.",
    ),
]
Bf16OptimizerOpt = Annotated[
    bool,
    typer.Option(
        "--bf16-optimizer",
        help="On deepspeed with amp-bf16/bf16 and --zero 1: DeepSpeed's BF16_Optimizer (fp32 gradient "
        "accumulation, bf16 all-reduce, parameter all-gather), as BLOOM-176B trained.",
    ),
]
ActivationFp8InputOpt = Annotated[
    bool,
    typer.Option(
        "--activation-fp8-input",
        help="On megatron with a SwiGLU model: the fused SwiGLU keeps its input in FP8 for the "
        "backward (Megatron-Core's activation_func_fp8_input_store, set on the model "
        "config by NeMo / Megatron-Bridge), as DeepSeek-V3 trained.",
    ),
]
LossOpt = Annotated[
    Optional[str],
    typer.Option(
        "--loss",
        help="Cross-entropy kernel: vocab_parallel (Megatron's), upcast (fp32 logits: Hugging Face, "
        "torchtitan), fused (flash-attn's xentropy), native (torch on 16-bit logits) or inplace "
        "(Transformer Engine's, Megatron-Bridge's recipes). Default: the framework's.",
    ),
]
TrainMetricsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--train-metrics",
        help="Cross-entropy metrics the trainer computes over each micro-batch's logits after its "
        "backward, from 0 to 8: Composer with llm-foundry's MPT or Hugging Face models logs 2 "
        "(LanguageCrossEntropy, LanguagePerplexity) unless use_train_metrics is off. Default: 0.",
    ),
]
RecomputeModulesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--recompute-modules",
        help="With --recompute selective on megatron: the modules re-run in the backward, "
        "comma-separated among core_attn (default), layernorm, mlp, moe, moe_act, "
        "shared_experts, mla_up_proj (Megatron-Core's --recompute-modules).",
    ),
]
MasterWeightsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--master-weights",
        help="How the optimizer keeps the master weights: fp32 (default) or remainder (the 16 "
        "low bits beside bf16 parameters: NeMo 1.x's distributed fused Adam, Megatron-Core's "
        "precision-aware optimizer; megatron only).",
    ),
]
Fp8ScalingOpt = Annotated[
    Optional[str],
    typer.Option(
        "--fp8-scaling",
        help="FP8 scaling recipe with --precision fp8: tensorwise (current per-tensor scaling: "
        "Transformer Engine, torchao tensorwise), rowwise (torchao rowwise: every operand cast "
        "along both axes), delayed (Transformer Engine's amax-history recipe: an amax all-reduce "
        "over the stage's ranks after each chunk's forward and backward), mxfp8 (one E8M0 scale "
        "per 32 elements; Blackwell's block-scaled tensor cores) or nvfp4 (Transformer Engine's "
        "NVFP4 recipe under the same autocast: the linear GEMMs in FP4 with an E4M3 scale per 16 "
        "elements; Blackwell's FP4 tensor cores). Default: the stack's "
        "(its profile's fp8_scaling); each runs its capabilities.fp8_scalings.",
    ),
]
Fp8ParamGatherOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--fp8-param-gather/--no-fp8-param-gather",
        help="With --precision fp8 and ZeRO >= 1, keep and all-gather the GEMM weights in FP8 "
        "(Megatron-Core's --fp8-param-gather with its distributed optimizer; megatron only), or in "
        "NVFP4 under --fp8-scaling nvfp4 (--fp4-param-gather). Default: the framework's (megatron: "
        "on, as NeMo's and Megatron-Bridge's FP8 recipes; off under nvfp4, as their NVFP4 recipe).",
    ),
]
TpCommOverlapOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--tp-comm-overlap/--no-tp-comm-overlap",
        help="Overlap the tensor-parallel collectives with their GEMMs: Megatron-Core's userbuffers "
        "(--tp-comm-overlap), torchtitan's async TP. Default: estimate, the framework's (off); "
        "recommend chooses it per plan where the framework runs it (on unless its buffers make "
        "the plan miss the memory).",
    ),
]
OverlapGradReduceOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--overlap-grad-reduce/--no-overlap-grad-reduce",
        help="Reduce the gradients during the backward, bucket by bucket (off: after it, as Megatron-LM "
        "2021-22's local DDP and DeepSpeed's default). Default: the framework's.",
    ),
]
OverlapParamGatherOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--overlap-param-gather/--no-overlap-param-gather",
        help="Gather ZeRO-sharded parameters under the previous step's forward (Megatron-Core's "
        "--overlap-param-gather; FSDP's prefetch). Default: the framework's.",
    ),
]
OverlapP2pOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--overlap-p2p/--no-overlap-p2p",
        help="Overlap the interleaved schedule's pipeline sends with compute (Megatron-Core's "
        "overlap_p2p_comm). Default: the framework's.",
    ),
]
CudaGraphsOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--cuda-graphs/--no-cuda-graphs",
        help="Capture each block's forward and backward as CUDA graphs, one host launch per pass "
        "(Megatron-Core's --enable-cuda-graph). Default: the framework's.",
    ),
]
MoeDispatcherOpt = Annotated[
    Optional[str],
    typer.Option(
        "--moe-dispatcher",
        help="Mixture-of-experts token dispatcher with --ep > 1: alltoall (NCCL all-to-all) or deepep "
        "(DeepEP's node-deduplicated kernels: Megatron-Core's flex dispatcher, torchtitan's "
        "DeepEPTokenDispatcher). Default: the framework's.",
    ),
]
MoeA2aOverlapOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--moe-a2a-overlap/--no-moe-a2a-overlap",
        help="Hide the expert-parallel dispatch and combine under another "
        "micro-batch's computation (Megatron-Core's "
        "--overlap-moe-expert-parallel-comm; megatron only). Default: off.",
    ),
]
MoeImbalanceOpt = Annotated[
    Optional[float],
    typer.Option(
        "--moe-imbalance",
        help="Routed tokens on the busiest expert-parallel rank over the mean, from 1 (balanced) to "
        "64 (default: 1.0, as force-balanced benchmarks run).",
    ),
]


def run_options_of(parameters: Mapping[str, Any]) -> RunOptions:
    """The RunOptions record of a command's parameters (`locals()`): every record field the command
    takes, by the same name; a field it does not take keeps its default. One place turns the command
    line into the record: a new run option needs its field, its option, the command's parameter."""
    given = {f.name: parameters[f.name] for f in fields(RunOptions) if f.name in parameters}
    if "recompute_modules" in given:
        given["recompute_modules"] = module_list(given["recompute_modules"])
    return RunOptions(**given)


def module_list(text: str | None) -> tuple[str, ...] | None:
    """--recompute-modules 'core_attn, mlp' as names (None when the option is not given)."""
    return None if text is None else tuple(m.strip() for m in text.split(","))


OBJECTIVE_PHRASES = {
    "throughput": "throughput (least step time)",
    "cost": "cost (least $ per 1B tokens; with {tokens}, least $ for the run including failures)",
    "memory": "memory (least memory within 5% of the best time)",
    "time-to-train": "time-to-train (least expected time for {tokens} including failures, checkpoints and restarts; "
    "docs/goodput.md)",
}
"""One phrase per ranking objective, in planner.search.OBJECTIVES' order (the set's owner; a test holds the
two equal): the --objective help of every command that ranks plans (recommend, report)."""


def objective_help(tokens_option: str) -> str:
    """--objective's help, naming the command's own run-length option (`--tokens`)."""
    phrases = [phrase.format(tokens=tokens_option) for phrase in OBJECTIVE_PHRASES.values()]
    return ", ".join(phrases[:-1]) + " or " + phrases[-1] + "."


JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document to stdout and nothing else there.")
]
PlanArg = Annotated[
    Path, typer.Argument(help="A plan JSON file written by `recommend --out` or `estimate --json`.")
]


def emit_json(document: dict, what: str = "--json output") -> None:
    """The one JSON document on stdout (--json): strict JSON, or one error line and nothing on stdout
    when a number is not finite (planner.io.dumps_strict)."""
    sys.stdout.write(dumps_strict(document, what) + "\n")
