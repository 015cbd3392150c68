"""Megatron-LM `pretrain_gpt.py` arguments (megatron/training/arguments.py as shipped in
megatron-core 0.19.2, 2026-09-18), one option per line; `# env NAME=value` lines name the
environment the launcher must set.

The arguments build the plan's model (layers, widths, GQA, positions, norm, MLP, biases, tied
embeddings, vocabulary) and pass `validate_args`; use them as
`torchrun ... pretrain_gpt.py $(grep -v '^#' FILE) --data-path ... --tokenizer-type ...`.
"""

from __future__ import annotations

from typing import Callable

from cost_models.comm import tp_overlapped
from cost_models.step import BF16_PARAM_PRECISIONS, Software
from frameworks import load_framework
from planner.exports.common import (
    Export,
    cannot,
    chunk_blocks,
    dp_replicas,
    header,
    model_moe,
    require_spec,
    steps_between_checkpoints,
)
from planner.exports.limits import _bias_pattern, megatron_limits
from planner.plan import Plan, fp8_scaling_of, run_options

MEGATRON_CP_COMM = {"p2p": "p2p", "all_gather": "allgather", "a2a": "a2a"}
"""Planner cp_comm -> Megatron-LM --cp-comm-type."""


def megatron_layout(stages) -> str:
    """Megatron-LM `--pipeline-model-parallel-layout` for blocks per model chunk, in layer order:
    [4, 5, 3] -> "Et*4|t*5|t*3L" (megatron.core.transformer.pipeline_parallel_layer_layout)."""
    parts = [f"t*{n}" for n in stages]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def megatron_placement(cfg) -> str:
    """The placement Megatron-LM's rank order gives (outermost first, planner letters, E left out as
    Megatron carves experts from dp x cp): order tp-cp-ep-dp-pp by default ("PDCT"), tp-cp-ep-pp-dp
    with --use-tp-pp-dp-mapping ("DPCT")."""
    return "".join(c for c in cfg.placement if c != "E" and (c != "C" or cfg.cp > 1))


def to_megatron(plan: Plan) -> Export:
    """Megatron-LM arguments for the plan (refusal when Megatron-LM cannot build or run it)."""
    refusals = megatron_limits(plan)
    if refusals:
        raise cannot("megatron", "; ".join(refusals))
    spec, moe = require_spec(plan, "megatron"), model_moe(plan)
    args: list[tuple[str, object]] = []
    add = lambda flag, value=None: args.append((flag, value))
    notes: list[str] = []
    env: dict[str, str] = {}
    _model_args(plan, spec, add, notes)
    if moe:
        _moe_args(plan, spec, moe, add, notes)
    _parallel_args(plan, moe, add, notes, env)
    _recompute_args(plan, add)
    _sharding_args(plan, add, notes)
    _offload_args(plan, spec, add, notes)
    _precision_args(plan, add, notes)
    _placement_schedule_args(plan, add, notes)
    _checkpoint_args(plan, add, notes)
    lines = [f"# {h}" for h in header(plan, "Megatron-LM (megatron-core 0.19.2) pretrain_gpt.py")]
    lines += [f"# env {k}={v}" for k, v in env.items()]
    lines += [flag if value is None else f"{flag} {value}" for flag, value in args]
    return Export(format="megatron", text="\n".join(lines) + "\n", notes=tuple(notes))


_AddArg = Callable[..., None]
"""`add(flag, value=None)`: append one argument line (a bare flag when value is None)."""


def _model_args(plan: Plan, spec, add: _AddArg, notes: list[str]) -> None:
    """The model: widths, attention, positions, block details, vocabulary, MLA, QK-norm, MTP."""
    cfg = plan.config
    add("--num-layers", spec.layers)
    add("--hidden-size", spec.hidden)
    add("--ffn-hidden-size", spec.d_ffn)
    add("--num-attention-heads", spec.heads)
    if spec.n_kv_heads != spec.heads:
        add("--group-query-attention")
        add("--num-query-groups", spec.n_kv_heads)
    if spec.mla is None and (spec.d_head != spec.hidden // spec.heads or spec.hidden % spec.heads):
        add("--kv-channels", spec.d_head)
    add("--seq-length", cfg.seq)
    _position_args(cfg, spec, add)
    if 0 < spec.sliding_window < cfg.seq:
        add("--window-size", f'"({spec.sliding_window},0)"')
    _block_args(spec, add)
    add("--attention-dropout", 0)
    add("--hidden-dropout", 0)
    add("--tokenizer-type", "NullTokenizer")
    add("--vocab-size", spec.vocab)
    notes.append(
        f"NullTokenizer with --vocab-size {spec.vocab} fixes the embedding shape; put your "
        "tokenizer in its place. Megatron pads the table to a multiple of 128 x tp "
        f"({padded_vocab(spec.vocab, cfg.tp)} rows)"
    )
    if spec.mla is not None:
        _mla_args(spec.mla, add, notes)
    if spec.qk_norm:
        add("--qk-layernorm")
    if spec.mtp_modules:
        add("--mtp-num-layers", spec.mtp_modules)


def _position_args(cfg, spec, add: _AddArg) -> None:
    """Position table size and type, and the rotary base."""
    positions = {"learned": "learned_absolute", "rope": "rope", "none": "none"}[spec.position]
    add(
        "--max-position-embeddings",
        max(cfg.seq, spec.n_positions) if spec.position == "learned" else cfg.seq,
    )
    add("--position-embedding-type", positions)
    if spec.position == "rope":
        add(
            "--rotary-base",
            int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta,
        )


def _block_args(spec, add: _AddArg) -> None:
    """Norm, MLP, biases and embedding tying of the blocks."""
    add("--normalization", "RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm")
    if spec.gated_mlp:
        add("--swiglu")
    bias = _bias_pattern(spec)
    if bias != "all":
        add("--disable-bias-linear")
    if bias == "qkv":
        add("--add-qkv-bias")
    if not spec.tied_embeddings:
        add("--untie-embeddings-and-output-weights")


def _mla_args(mla, add: _AddArg, notes: list[str]) -> None:
    """DeepSeek-V2/V3 multi-head latent attention (MLATransformerConfig)."""
    add("--multi-latent-attention")
    if mla.q_lora_rank:
        add("--q-lora-rank", mla.q_lora_rank)
    add("--kv-lora-rank", mla.kv_lora_rank)
    add("--qk-head-dim", mla.qk_nope_head_dim)
    add("--qk-pos-emb-head-dim", mla.qk_rope_head_dim)
    add("--v-head-dim", mla.v_head_dim)
    notes.append(
        "MLA: rotary scaling (DeepSeek-V3's YaRN, --rope-type yarn --rotary-scaling-factor 40) "
        "is not in the plan's model; add it for long contexts"
    )


def _moe_args(plan: Plan, spec, moe, add: _AddArg, notes: list[str]) -> None:
    """The experts, their router and the token dispatcher."""
    add("--num-experts", moe.experts)
    add("--moe-router-topk", moe.top_k)
    add("--moe-ffn-hidden-size", moe.expert_ffn)
    if moe.shared_experts:
        add("--moe-shared-expert-intermediate-size", moe.shared_experts * moe.d_shared_ffn)
        if moe.shared_expert_gate:
            add("--moe-shared-expert-gate")
    if moe.first_dense_layers:
        add(
            "--moe-layer-freq",
            f'"([0]*{moe.first_dense_layers}+[1]*{spec.layers - moe.first_dense_layers})"',
        )
    _moe_router_args(moe, add)
    if moe.capacity_factor is not None:
        add("--moe-expert-capacity-factor", moe.capacity_factor)
    add("--moe-grouped-gemm")
    _moe_dispatcher_args(plan, add, notes)


def _moe_router_args(moe, add: _AddArg) -> None:
    """Router score function, pre-softmax, expert bias, group-limited routing and scaling."""
    add("--moe-router-score-function", moe.router)
    if moe.router == "softmax" and not moe.normalize_top_k:
        # softmax over all experts, top-k probabilities kept as they are
        add("--moe-router-pre-softmax")
    if moe.aux_free_bias:
        add("--moe-router-enable-expert-bias")  # DeepSeek-V3's auxiliary-loss-free balancing bias
    if moe.expert_groups > 1 and moe.groups_per_token:
        add("--moe-router-num-groups", moe.expert_groups)
        add("--moe-router-group-topk", moe.groups_per_token)
    if moe.routed_scaling != 1.0:
        add("--moe-router-topk-scaling-factor", moe.routed_scaling)


def _moe_dispatcher_args(plan: Plan, add: _AddArg, notes: list[str]) -> None:
    """Token dispatcher (alltoall, or DeepEP through the flex dispatcher) and the a2a overlap."""
    cfg, software = plan.config, plan.document.get("software") or {}
    exchange = cfg.ep * cfg.expert_tp > 1
    if software.get("moe_dispatcher") == "deepep" and exchange:
        # DeepEP through the flex dispatcher (TransformerConfig.moe_flex_dispatcher_backend,
        # megatron-core 0.19; --moe-enable-deepep before 0.15)
        add("--moe-token-dispatcher-type", "flex")
        add("--moe-flex-dispatcher-backend", "deepep")
    else:
        add("--moe-token-dispatcher-type", "alltoall")
        if software.get("moe_dispatcher") == "deepep":
            notes.append(
                "moe_dispatcher=deepep left out: with ep x expert_tp = 1 no token leaves its "
                "rank, and Megatron-Core's flex dispatcher asserts TPxEP > 1; the export writes "
                "alltoall"
            )
    if software.get("moe_a2a_overlap") and cfg.ep > 1:  # what it cannot run: megatron_limits
        add("--overlap-moe-expert-parallel-comm")
    elif software.get("moe_a2a_overlap"):
        notes.append(
            "moe_a2a_overlap left out: with ep = 1 there is no expert-parallel exchange to hide "
            "(Megatron-Core asserts expert_model_parallel_size > 1 for the overlap)"
        )


def _parallel_args(plan: Plan, moe, add: _AddArg, notes: list[str], env: dict[str, str]) -> None:
    """Parallel degrees, pipeline split, batch, sequence parallelism and TP overlap."""
    cfg = plan.config
    add("--tensor-model-parallel-size", cfg.tp)
    add("--pipeline-model-parallel-size", cfg.pp)
    for flag, value in _stage_args(plan, notes):
        add(flag, value)
    if cfg.cp > 1:
        add("--context-parallel-size", cfg.cp)
        add("--cp-comm-type", MEGATRON_CP_COMM[cfg.cp_comm])
    if cfg.ep > 1:
        add("--expert-model-parallel-size", cfg.ep)
    if moe or cfg.expert_tp > 1:
        add("--expert-tensor-parallel-size", cfg.expert_tp)
    add("--micro-batch-size", cfg.micro_batch)
    add("--global-batch-size", cfg.global_batch)
    if cfg.sequence_parallel and cfg.tp > 1:
        add("--sequence-parallel")
    elif cfg.tp > 1 and moe:
        add("--sequence-parallel")
        notes.append(
            "Megatron-LM requires sequence parallelism with MoE and tp > 1; turned on "
            "(less activation memory)"
        )
    notes += _tp_overlap_args(plan, add)
    if (cfg.tp > 1 or cfg.cp > 1) and cfg.zero < 2:
        # validate_args asks for 1 with TP/CP on pre-Blackwell GPUs, and for "unset or > 1" with
        # Megatron FSDP
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"


def _recompute_args(plan: Plan, add: _AddArg) -> None:
    """Full recomputation (uniform, or the first N blocks of each chunk) or selective modules."""
    cfg = plan.config
    if cfg.recompute == "full":
        add("--recompute-granularity", "full")
        if cfg.recompute_layers is not None:
            # the first N blocks of each pipeline chunk, the rest keep theirs
            add("--recompute-method", "block")
            add("--recompute-num-layers", cfg.recompute_layers)
        else:
            add("--recompute-method", "uniform")
            add("--recompute-num-layers", 1)
    elif cfg.recompute == "selective":
        add("--recompute-granularity", "selective")
        modules = (plan.document.get("software") or {}).get("recompute_modules")
        if modules:  # the modules the plan was costed with (Megatron-Core's default is core_attn)
            add("--recompute-modules", " ".join(modules))


def _sharding_args(plan: Plan, add: _AddArg, notes: list[str]) -> None:
    """ZeRO-1 as the distributed optimizer, ZeRO-2/3 as Megatron FSDP (hybrid with dp_shard), and
    the overlap of gradient reduction and parameter gathering."""
    cfg = plan.config
    if cfg.zero == 1:
        add("--use-distributed-optimizer")
        if dp_replicas(plan) > 1:
            add("--num-distributed-optimizer-instances", dp_replicas(plan))
    elif cfg.zero >= 2:
        add("--use-megatron-fsdp")
        add(
            "--data-parallel-sharding-strategy",
            "optim_grads" if cfg.zero == 2 else "optim_grads_params",
        )
        add("--ckpt-format", "fsdp_dtensor")
        if dp_replicas(plan) > 1:
            # hybrid FSDP: shard within groups of dp_shard, replicate across them
            add("--num-distributed-optimizer-instances", dp_replicas(plan))
            notes.append(
                f"dp_shard={cfg.shard_group}: Megatron FSDP's hybrid mode (HSDP: --num-distributed-optimizer-"
                f"instances {dp_replicas(plan)} makes the outer, replicated dimension; megatron/core/distributed/"
                "fsdp/mcore_fsdp_adapter.py enable_hsdp)"
            )
    if cfg.dp > 1:
        add("--overlap-grad-reduce")
        if cfg.zero >= 1:
            add("--overlap-param-gather")


def _offload_args(plan: Plan, spec, add: _AddArg, notes: list[str]) -> None:
    """Optimizer offload (through the distributed optimizer) and activation offload."""
    cfg = plan.config
    if cfg.offloads("optimizer"):
        if cfg.zero == 0:
            add("--use-distributed-optimizer")
            notes.append(
                "offload=optimizer: Megatron offloads through the distributed optimizer, so ZeRO-1 is on "
                "(less memory than ZeRO-0)"
            )
        add("--optimizer-cpu-offload")
        add("--use-precision-aware-optimizer")
    if cfg.offloads("activations"):
        # Megatron-Core's layer-level CPU offloading (Transformer Engine's offload context): all but the
        # last layer's activations go to the host (num_layers - 1 is its ceiling)
        add("--cpu-offloading-num-layers", spec.layers - 1)
        notes.append(
            f"offload=activations: --cpu-offloading-num-layers {spec.layers - 1} (Megatron offloads at "
            "most num_layers - 1 layers; no pipelining or recomputation with it)"
        )


def _precision_args(plan: Plan, add: _AddArg, notes: list[str]) -> None:
    """bf16/fp16/fp8 arguments, and notes on precision options Megatron-LM cannot take as arguments."""
    cfg = plan.config
    if cfg.precision in BF16_PARAM_PRECISIONS:
        add("--bf16")
    elif cfg.precision == "amp-fp16":
        add("--fp16")
    if cfg.precision == "bf16":
        notes.append(
            "precision bf16 (no fp32 master weights): Megatron keeps fp32 main parameters in its optimizer "
            "(more memory than planned unless you add --use-precision-aware-optimizer --main-params-dtype bf16)"
        )
    if (plan.document.get("software") or {}).get("cuda_graphs"):
        add("--enable-cuda-graph")  # per-layer graphs (megatron/training/arguments.py)
    notes += _model_config_notes(plan)
    if cfg.precision == "fp8":
        recipe = fp8_scaling_of(plan.document)  # the recipe costed (retarget)
        if recipe == "nvfp4":
            _fp4_args(plan, add, notes)
            return
        # E4M3 throughout for MXFP8 (TE's MXFP8BlockScaling default, Megatron-Bridge's MXFP8
        # mixed precision); E4M3 forward, E5M2 gradients for the per-tensor recipes
        add("--fp8-format", "e4m3" if recipe == "mxfp8" else "hybrid")
        # Megatron-LM's --fp8-recipe: delayed (amax history), tensorwise (current scaling), mxfp8
        add("--fp8-recipe", recipe)
        if _fp8_parameters(plan):
            add("--fp8-param-gather")  # FP8 parameters, gathered in FP8 (Software.fp8_param_gather)
        notes.append(
            "fp8 needs Transformer Engine (--transformer-impl transformer_engine, the default)"
        )


def _fp4_args(plan: Plan, add: _AddArg, notes: list[str]) -> None:
    """The nvfp4 recipe: Megatron-LM's FP4 arguments in place of the FP8 ones, which it refuses
    beside them (megatron/training/arguments.py: '--fp4-format and --fp8-format cannot be used
    simultaneously'); E2M1 is the only format, nvfp4 Transformer Engine's NVFP4BlockScaling."""
    add("--fp4-format", "e2m1")
    add("--fp4-recipe", "nvfp4")
    if _fp8_parameters(plan):
        add("--fp4-param-gather")  # NVFP4 parameters, gathered in NVFP4 (fp8_param_gather)
    notes.append(
        "nvfp4 needs Transformer Engine >= 2.8 (NVFP4BlockScaling) and FP4 tensor cores (Blackwell)"
    )


def _model_config_notes(plan: Plan) -> list[str]:
    """Software options of the plan that are settings of the model config, not arguments."""
    software, notes = plan.document.get("software") or {}, []
    if software.get("activation_fp8_input"):
        notes.append(
            "activation_fp8_input: Megatron-LM has no argument for TransformerConfig."
            "activation_func_fp8_input_store; set it on the model config (NeMo / Megatron-Bridge: "
            "activation_func_fp8_input_store=True), or the SwiGLU inputs take twice the bytes the plan counted"
        )
    if software.get("loss") == "inplace":
        notes.append(
            "loss inplace: Transformer Engine's cross-entropy is Megatron-Bridge's setting "
            "(cross_entropy_fusion_impl='te' on the model config); Megatron-LM's validate_args refuses "
            "--cross-entropy-fusion-impl te, and its own loss keeps 4 more bytes per logit on the last stage"
        )
    return notes


def _placement_schedule_args(plan: Plan, add: _AddArg, notes: list[str]) -> None:
    """Rank order (--use-tp-pp-dp-mapping) and the schedules Megatron-LM runs in place of the plan's."""
    cfg = plan.config
    if megatron_placement(cfg) == ("DPCT" if cfg.cp > 1 else "DPT"):
        add("--use-tp-pp-dp-mapping")
    elif megatron_placement(cfg) != ("PDCT" if cfg.cp > 1 else "PDT"):
        notes.append(
            f"Megatron orders ranks tp-cp-ep-dp-pp (placement PDT) or tp-cp-ep-pp-dp (DPT); placement "
            f"{cfg.placement} is not expressible, exported with the default order (same result, other links)"
        )
    if cfg.pp > 1 and cfg.schedule == "gpipe":
        notes.append(
            "Megatron has no GPipe schedule; it runs 1F1B (same step time in the plan's model, less memory)"
        )
    if cfg.pp > 1 and cfg.schedule == "zero-bubble":
        notes.append(
            "zero-bubble schedule: Megatron-LM mainline runs 1F1B (bubble (p-1)/m instead of (p-1)/(3m)); "
            "the ZB-H1 schedule needs the zero-bubble fork"
        )


def _checkpoint_args(plan: Plan, add: _AddArg, notes: list[str]) -> None:
    """--save-interval from the plan's checkpoint interval."""
    steps = steps_between_checkpoints(plan)
    if steps:
        add("--save-interval", steps)
        notes.append(
            f"--save-interval {steps}: the plan's checkpoint interval "
            f"{plan.document['plan']['checkpoint_interval_s']:g} s "
            f"at the predicted {plan.prediction.step_time_s:.3f} s per step; add --save DIR"
        )


def _stage_args(plan: Plan, notes: list[str]) -> list[tuple[str, object]]:
    """How the blocks are split over the pipeline: virtual stages, first/last stage sizes, or a layout."""
    cfg = plan.config
    if cfg.pp == 1:
        return []
    stages = chunk_blocks(plan)
    if len(set(stages)) == 1:
        return (
            [("--num-virtual-stages-per-pipeline-rank", cfg.virtual_stages)]
            if cfg.virtual_stages > 1
            else []
        )
    middle = stages[1:-1]
    if cfg.virtual_stages == 1 and len(set(middle)) <= 1 and cfg.pp > 2:
        # first/last stage sizes, the middle split evenly by Megatron-LM
        return [
            ("--decoder-first-pipeline-num-layers", stages[0]),
            ("--decoder-last-pipeline-num-layers", stages[-1]),
        ]
    # any split: one '|'-separated segment per model chunk in layer order (chunk = virtual rank * pp + rank)
    return [("--pipeline-model-parallel-layout", f'"{megatron_layout(stages)}"')]


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Rows of Megatron-LM's embedding: vocab rounded up to a multiple of divisible_by x tp
    (megatron.training vocab padding with the default --make-vocab-size-divisible-by 128)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def _tp_overlap_args(plan, add) -> list[str]:
    """--tp-comm-overlap where the plan overlaps its tensor-parallel collectives
    (cost_models.comm.tp_overlapped: tp > 1 with sequence parallelism, which Megatron-LM requires);
    the notes for a plan whose software asks for it where it cannot run."""
    cfg, software = plan.config, plan.document.get("software") or {}
    if not software.get("tp_comm_overlap"):
        return []
    if bool(tp_overlapped(True, cfg.tp, cfg.sequence_parallel)):
        add("--tp-comm-overlap")
        return []
    return [
        "tp_comm_overlap left out: it overlaps the sequence-parallel collectives of tp > 1 "
        "(Megatron-LM asserts --sequence-parallel with --tp-comm-overlap); the plan has none"
    ]


def _fp8_parameters(plan: Plan) -> bool:
    """The plan's GEMM weights are FP8 parameters gathered in FP8: its run options with the
    framework's defaults (a plan file from before the option has megatron's), under FP8 with
    ZeRO >= 1 (cost_models.step.Software.gathers_fp8)."""
    cfg = plan.config
    software = Software.of(load_framework(cfg.framework), run_options(plan.document))
    return bool(software.gathers_fp8(cfg.precision, cfg.zero))
