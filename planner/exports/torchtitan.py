"""torchtitan 0.3.0 job: a Python config module (torchtitan 0.3 reads no TOML; a job is a function
returning `torchtitan.trainer.Trainer.Config`, chosen with `--module` and `--config`).

Save the text as e.g. `planner_job.py` and run
`PYTHONPATH=. torchrun --nnodes N --nproc_per_node G -m torchtitan.train --module planner_job --config planner_job`
(torchtitan/config/manager.py: a `--module` that is not a built-in model name is imported as given).
CLI overrides such as `--training.steps 1000` still apply on top.

Names and meanings (torchtitan 0.3.0, PyPI wheel of 2026-09): `ParallelismConfig` and
`TrainingConfig` (torchtitan/config/configs.py), `FullAC` / `SelectiveAC`
(torchtitan/distributed/activation_checkpoint.py), `CheckpointManager.Config.interval`
(components/checkpointer/base.py), `Float8LinearConverter` (components/quantization/float8.py); the
llama3 model and its module names `tok_embeddings`, `layers.<i>`, `norm`, `lm_head`
(torchtitan/models/llama3/__init__.py); the MoE families deepseek_v3 (`build_mla_moe_layers`,
`_build_mtp_layers`), qwen3 (`_build_qwen3_moe_layers`) and gpt_oss (`_make_gptoss_attn_config`,
`_make_gptoss_experts_config`, as `_build_gptoss_layers` uses them), their `model_registry` and
config_registry jobs (torchtitan/models/<family>/__init__.py, config_registry.py), the MoE config
helpers (torchtitan/models/common/config_utils.py) and `Float8GroupedExpertsConverter`; pipeline
schedules of torch.distributed.pipelining.
"""

from __future__ import annotations

from pathlib import Path

from planner.exports.common import (
    Export,
    cannot,
    chunk_blocks,
    devices_per_node,
    header,
    require_spec,
    steps_between_checkpoints,
)
from planner.exports.limits import (
    TORCHTITAN_DENSE_FAMILIES,
    TORCHTITAN_MOE_FAMILIES,
    torchtitan_limits,
)
from planner.plan import Plan, fp8_scaling_of

SPMD_BACKEND = "partial_dtensor"
"""torchtitan's DTensor backend for the model-parallel axes (ParallelismConfig.spmd_backend)."""

TORCHTITAN_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "zero-bubble": "InterleavedZeroBubble",
}
"""Planner schedule -> torch.distributed.pipelining schedule name (get_schedule_class)."""

TORCHTITAN_LLAMA3_FLAVORS = {
    # flavor: (layers, hidden, heads, kv_heads, ffn, vocab, tied) of torchtitan 0.3.0's llama3 registry
    # (torchtitan/models/llama3/__init__.py: _1b ... _405b; ffn from compute_ffn_hidden_dim there)
    "1B": (16, 2048, 32, 8, 8192, 128256, True),
    "3B": (28, 3072, 24, 8, 8192, 128256, True),
    "8B": (32, 4096, 32, 8, 14336, 128256, False),
    "70B": (80, 8192, 64, 8, 28672, 128256, False),
    "405B": (126, 16384, 128, 8, 53248, 128256, False),
}
_JOB_OF_FLAVOR = {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}
"""torchtitan's own job for a flavor (config_registry.py); others start from llama3_8b."""

MOE_COMM_BACKENDS = {"alltoall": "standard", "deepep": "deepep"}
"""Plan's token dispatcher (software.moe_dispatcher) -> torchtitan's moe_comm_backend
(models/common/config_utils.py make_token_dispatcher_config: 'standard' is AllToAllTokenDispatcher,
all_to_all_single over the ep mesh, local dispatch when ep = 1; 'deepep' is DeepEPTokenDispatcher)."""

LOAD_BALANCE_COEFF = 1e-3
"""MoE.Config.load_balance_coeff of every torchtitan 0.3.0 MoE flavor (config_utils.make_moe_config's default):
the auxiliary-loss-free expert bias (models/common/moe.py MoE, register_moe_load_balancing_hook)."""


def torchtitan_fqns(stages, *, positions: bool = False) -> list[list[str]]:
    """Module names per model chunk for torchtitan's decoders (tok_embeddings, [pos_embeddings for the
    GPT model of planner.exports.torchtitan_models], layers.i, norm, lm_head)."""
    parts, start = [], 0
    for i, count in enumerate(stages):
        names = [f"layers.{j}" for j in range(start, start + count)]
        start += count
        if i == 0:
            names[:0] = ["tok_embeddings", "pos_embeddings"] if positions else ["tok_embeddings"]
        if i == len(stages) - 1:
            names += ["norm", "lm_head"]
        parts.append(names)
    return parts


def to_torchtitan(plan: Plan) -> Export:
    """The torchtitan 0.3.0 config module of the plan (refusal when torchtitan cannot run it)."""
    refusals = torchtitan_limits(plan)
    if refusals:
        raise cannot("torchtitan", "; ".join(refusals))
    cfg, spec, notes = plan.config, require_spec(plan, "torchtitan"), []
    family = torchtitan_family(spec)
    flavor = _flavor(spec) if family == "llama3" else None
    parallelism = _data_parallelism(cfg, notes)
    parallelism.update(_model_parallelism(plan, spec, family, notes))
    notes += _run_difference_notes(cfg)
    training = _training(cfg, notes)
    ac = _activation_checkpointing(cfg, notes)
    steps = steps_between_checkpoints(plan)
    notes += _model_notes(cfg, family, fp8_scaling_of(plan.document))
    text = _module_text(plan, spec, family, flavor, training, parallelism, ac, steps)
    return Export(format="torchtitan", text=text, notes=tuple(notes))


def _data_parallelism(cfg, notes: list[str]) -> dict[str, object]:
    """data_parallel_replicate/shard degrees and resharding of the job (notes on how they differ
    from the plan's ZeRO stage and shard group)."""
    dp_shard = torchtitan_dp_shard(cfg)
    if dp_shard == 1 and cfg.zero == 0:
        return dict(data_parallel_replicate_degree=cfg.dp, data_parallel_shard_degree=1)
    notes += _sharding_notes(cfg, dp_shard)
    return dict(
        data_parallel_replicate_degree=cfg.dp // dp_shard,
        data_parallel_shard_degree=dp_shard,
        fsdp_reshard_after_forward="always" if cfg.zero == 3 else "never",
    )


def _sharding_notes(cfg, dp_shard: int) -> list[str]:
    """How torchtitan's FSDP2 sharding over dp_shard ranks differs from the plan's ZeRO stage."""
    notes = []
    if cfg.zero == 3:
        # torchtitan's "default" keeps parameters gathered after forward under pipeline parallelism and leaves
        # the last layers (final norm, output) gathered without it (distributed/fsdp.py
        # get_fsdp_reshard_after_forward_policy, apply_fsdp_to_decoder): the plan's ZeRO-3 memory assumes
        # every unit resharded
        notes.append(
            "zero=3 exported as fsdp_reshard_after_forward='always': torchtitan's 'default' would keep "
            + (
                "each stage's parameters gathered between micro-batches under pipeline parallelism "
                "(ZeRO-2 memory)"
                if cfg.pp > 1
                else "the final norm and output layer gathered"
            )
            + ", which the plan's memory does not include"
        )
    if dp_shard != (1 if cfg.zero == 0 else cfg.shard_group):
        planned = (
            "ZeRO-0 (no sharding)"
            if cfg.zero == 0
            else f"shard groups of dp_shard={cfg.shard_group}"
        )
        notes.append(
            f"ep={cfg.ep} with {planned}: torchtitan 0.3.0 carves the expert-parallel ranks from dp_shard x "
            f"cp x tp, never from data-parallel replicas (ParallelismConfig.expert_parallel_degree, "
            f"distributed/parallel_dims.py build_mesh), so the job shards over dp_shard={dp_shard} "
            f"(HSDP with {cfg.dp // dp_shard} replicas"
            + (", without resharding after forward: ZeRO-2" if cfg.zero == 0 else "")
            + "): less memory than planned, more all-gather and reduce-scatter traffic"
        )
    if cfg.zero == 1:
        notes.append(
            "torchtitan has no optimizer-only sharding (ZeRO-1); exported as FSDP2 without resharding "
            "after forward (ZeRO-2): same parameters in memory, less gradient memory"
        )
    return notes


def _model_parallelism(plan: Plan, spec, family: str, notes: list[str]) -> dict[str, object]:
    """Tensor, pipeline, context and expert degrees, async TP, the DTensor backend and the pipeline
    schedule of the job."""
    cfg = plan.config
    parallelism: dict[str, object] = dict(
        tensor_parallel_degree=cfg.tp,
        enable_sequence_parallel=cfg.tp > 1,
        pipeline_parallel_degree=cfg.pp,
        context_parallel_degree=cfg.cp,
    )
    if (plan.document.get("software") or {}).get("tp_comm_overlap") and cfg.tp > 1:
        parallelism.update(enable_async_tensor_parallel=True)
        notes.append(
            "tp_comm_overlap: parallelism.enable_async_tensor_parallel = True (PyTorch's async TP); "
            "torchtitan refuses it without torch.compile of the model (compile.enable)"
        )
    if family in TORCHTITAN_MOE_FAMILIES:
        parallelism.update(expert_parallel_degree=cfg.ep)
        notes += _moe_notes(plan, spec)
    parallelism.update(spmd_backend=SPMD_BACKEND)
    notes.append(
        f"parallelism.spmd_backend={SPMD_BACKEND!r}: torchtitan 0.3.0's default 'spmd_types' hands FSDP2 "
        "plain tensors with SPMD annotations, which torch 2.13.0's fully_shard refuses with data and tensor "
        "parallelism (it needs a newer torch); the DTensor backend shards the same way"
    )
    if cfg.tp > 1 and not cfg.sequence_parallel:
        notes.append(
            "torchtitan applies sequence parallelism with TP (enable_sequence_parallel); the plan did not "
            "(less activation memory)"
        )
    if cfg.pp > 1:
        parallelism.update(_pipeline_parallelism(plan, spec, family, notes))
    return parallelism


def _pipeline_parallelism(plan: Plan, spec, family: str, notes: list[str]) -> dict[str, object]:
    """Schedule, micro-batch size and module names per model part (pp > 1)."""
    cfg = plan.config
    if spec.tied_embeddings:
        notes.append(
            "tied embeddings with pipeline parallelism (torchtitan's Decoder refuses them): the first and "
            "last stages each hold the table, start from the last stage's values and add their gradients "
            "before each optimizer step (Megatron-LM's scheme); torchtitan's gradient clipping sees the "
            "two partial gradients"
        )
    return dict(
        pipeline_parallel_schedule=TORCHTITAN_SCHEDULES[cfg.schedule],
        pipeline_parallel_microbatch_size=cfg.micro_batch,
        module_fqns_per_model_part=torchtitan_fqns(chunk_blocks(plan), positions=family == "gpt"),
    )


def _run_difference_notes(cfg) -> list[str]:
    """Context parallelism, offload, placement and selective recompute as torchtitan runs them."""
    notes = []
    if cfg.cp > 1 and cfg.cp_comm != "all_gather":
        notes.append(
            f"cp_comm={cfg.cp_comm}: torchtitan's context parallelism (torch's context_parallel) gathers "
            "keys/values (all_gather) unless the script sets torch's rotate method; same result"
        )
    if cfg.cp > 1 and cfg.zero >= 1:
        notes.append(
            "torchtitan shards FSDP over dp_shard x cp ranks (more sharding than planned: less memory)"
        )
    if cfg.offloads("optimizer"):
        notes.append(
            "offload=optimizer exported as FSDP2 CPU offload (parameters, gradients and optimizer states "
            "on the host: less GPU memory, more host traffic)"
        )
    if cfg.placement.replace("C", "").replace("E", "") != "PDT":
        notes.append(
            f"torchtitan orders its mesh pp, dp_replicate, dp_shard, cp, tp (placement PDT); placement "
            f"{cfg.placement} is not expressible (same result, other links)"
        )
    if cfg.recompute == "selective":
        notes.append(
            "recompute=selective exported as torchtitan's per-op SelectiveAC (saves matmul outputs, recomputes "
            "the rest): close to, not the same as, Megatron's attention-core recompute"
        )
    return notes


def _training(cfg, notes: list[str]) -> dict[str, object]:
    """The job's TrainingConfig fields: batch, sequence, dtypes, CPU offload, CUDA graphs."""
    # torchtitan 0.3.0 (trainer.py): each accumulation step runs local_batch_size sequences per
    # data-parallel rank, split into pipeline micro-batches of pipeline_parallel_microbatch_size
    # with pp > 1, and accumulates global / (local x dp) steps; so pp = 1 runs the plan's
    # micro-batch per forward and accumulates the rest
    local_batch = cfg.global_batch // cfg.dp if cfg.pp > 1 else cfg.micro_batch
    training = {
        "local_batch_size": local_batch,
        "global_batch_size": cfg.global_batch,
        "seq_len": cfg.seq,
        "dtype": "bfloat16" if cfg.precision == "bf16" else "float32",
        "mixed_precision_param": "float32" if cfg.precision == "fp32" else "bfloat16",
        "enable_cpu_offload": cfg.offloads("optimizer"),
        "disable_cuda_graphs": cfg.pp > 1 or cfg.ep > 1,
    }
    if cfg.pp > 1:
        notes.append(
            "training.disable_cuda_graphs = True: torchtitan 0.3.0 has no CUDA graphs with pipeline parallelism"
        )
    elif cfg.ep > 1:
        notes.append(
            "training.disable_cuda_graphs = True: torchtitan 0.3.0's CUDA graphs refuse expert-parallel token "
            "dispatchers that synchronize with the host, as its all-to-all and DeepEP ones do "
            "(trainer.py Trainer.Config._validate_cuda_graphs)"
        )
    return training


def _activation_checkpointing(cfg, notes: list[str]) -> str:
    """The job's activation checkpointing config expression (None, FullAC, SelectiveAC, or the
    job's FirstBlocksAC for recompute_layers)."""
    ac = {"none": "None", "full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}[
        cfg.recompute
    ]
    if cfg.recompute == "full" and cfg.recompute_layers is not None:
        ac = f"FirstBlocksAC.Config(blocks={cfg.recompute_layers})"
        notes.append(
            f"recompute_layers={cfg.recompute_layers}: FirstBlocksAC (defined in the job) recomputes the first "
            f"{cfg.recompute_layers} blocks of each model part; torchtitan 0.3.0's own policies wrap every block"
        )
    return ac


def _model_notes(cfg, family: str, fp8_scaling: str | None) -> list[str]:
    """FP8 converters (and the recipe they run where the plan costed another) and the job's own GPT
    model."""
    notes = []
    if cfg.precision == "fp8" and fp8_scaling not in (None, "rowwise"):
        notes.append(
            f"fp8_scaling={fp8_scaling}: torchtitan 0.3.0's Float8LinearConverter has the rowwise "
            "recipes only, so the job scales by row, which casts every operand along both axes "
            "(estimate --fp8-scaling rowwise costs that); torchtitan before 0.3.0 ran tensorwise"
        )
    if cfg.precision == "fp8" and family in TORCHTITAN_MOE_FAMILIES:
        notes.append(
            "fp8: torchtitan's Float8LinearConverter (torchao rowwise recipe) on every Linear but the routers' "
            "gates (float32, as deepseek_v3_671b_float8) and Float8GroupedExpertsConverter on the routed "
            "experts; needs torchao and an SM89+ GPU; add --compile.enable for speed"
        )
    elif cfg.precision == "fp8":
        notes.append(
            "fp8: torchtitan's Float8LinearConverter (torchao rowwise recipe) on every Linear; "
            "needs torchao and an SM89+ GPU; add --compile.enable for speed"
        )
    if family == "gpt":
        notes.append(
            "the job defines the GPT model itself (torchtitan 0.3.0 has none): token + learned position "
            "embeddings, pre-LayerNorm blocks with biases and a GELU MLP, parallelized by torchtitan's llama3 "
            "functions; no Hugging Face checkpoint adapter (state_dict_adapter None)"
        )
    return notes


def torchtitan_dp_shard(cfg) -> int:
    """data_parallel_shard_degree of the job: the plan's shard group (1 for ZeRO-0), widened for expert
    parallelism to the smallest multiple dividing dp whose dp_shard x cp x tp ranks the ep ranks divide
    (torchtitan 0.3.0 carves ep from them: config/configs.py ParallelismConfig.expert_parallel_degree; dp x cp x
    tp always qualifies, planner.parallel.expert_parallel_ok)."""
    base = 1 if cfg.zero == 0 else cfg.shard_group
    if cfg.ep == 1:
        return base
    return next(
        s
        for s in range(base, cfg.dp + 1, base)
        if cfg.dp % s == 0 and s * cfg.cp * cfg.tp % cfg.ep == 0
    )


def _moe_notes(plan: Plan, spec) -> list[str]:
    """How the MoE job differs from the plan (torchtitan_limits has refused what it cannot run)."""
    cfg, notes = plan.config, []
    efsdp = torchtitan_dp_shard(cfg) * cfg.cp * cfg.tp // cfg.ep
    if cfg.ep == 1 and cfg.tp > 1:
        notes.append(
            f"ep=1 with tp={cfg.tp}: torchtitan 0.3.0 shards every expert over the tp ranks "
            "(models/common/moe_sharding.py expert_param_placement_dense), as the plan is costed "
            "(frameworks/torchtitan.json experts_follow_tp_without_ep)"
        )
    if cfg.ep > 1 and cfg.zero == 0 and efsdp > 1:
        notes.append(
            f"ep={cfg.ep} with ZeRO-0: torchtitan FSDP-shards the routed experts over the efsdp = dp_shard x cp x "
            f"tp / ep = {efsdp} ranks that hold the same experts (distributed/fsdp.py apply_fsdp_to_decoder): "
            "less expert memory, an all-gather per MoE block"
        )
    return notes + _moe_dispatch_notes(plan) + _moe_model_notes(cfg, spec)


def _moe_dispatch_notes(plan: Plan) -> list[str]:
    """The token dispatcher, its overlap and FP8 dispatch as torchtitan runs them."""
    cfg, notes = plan.config, []
    software = plan.document.get("software") or {}
    dispatcher = software.get("moe_dispatcher", "alltoall")
    if cfg.ep > 1 and dispatcher == "deepep" and _comm_backend(plan) == "deepep":
        notes.append(
            "moe_dispatcher=deepep: torchtitan's DeepEPTokenDispatcher (moe_comm_backend='deepep'); needs "
            "DeepEP >= 2.0 (deep_ep.ElasticBuffer) installed"
        )
    elif cfg.ep > 1 and dispatcher == "deepep":
        notes.append(
            "moe_dispatcher=deepep with fp8: torchtitan's Float8GroupedExpertsConverter needs a dispatcher that "
            "pads (components/quantization/utils.py swap_token_dispatcher: TorchAOTokenDispatcher or HybridEP), "
            "so the job exchanges tokens with the all-to-all one: a slower exchange than planned"
        )
    if cfg.ep > 1 and software.get("moe_a2a_overlap"):
        notes.append(
            "moe_a2a_overlap: torchtitan 0.3.0 runs the expert-parallel exchange on the compute stream, between "
            "the router and the expert GEMMs (no overlap with another micro-batch): slower than planned"
        )
    if cfg.ep > 1 and software.get("moe_fp8_dispatch"):
        notes.append(
            "moe_fp8_dispatch: torchtitan's token dispatchers send the activations in their own dtype (bf16), "
            "not FP8: twice the dispatch bytes planned"
        )
    return notes


def _moe_model_notes(cfg, spec) -> list[str]:
    """Load balancing, RoPE scaling, MTP and gpt-oss experts of torchtitan's MoE families."""
    notes = []
    if not spec.moe.aux_free_bias:
        notes.append(
            f"expert load balancing: torchtitan 0.3.0 has no auxiliary balancing loss; the job keeps its "
            f"MoE flavors' auxiliary-loss-free expert bias (MoE.Config.load_balance_coeff={LOAD_BALANCE_COEFF}, "
            "a per-expert routing bias updated outside the gradients), which the plan's model does not name"
        )
    if spec.model_type in ("deepseek_v3", "gpt_oss"):
        described = (
            f"only YaRN's attention factor, {spec.rope_attention_factor:.4g}, which costs the step"
            if spec.rope_attention_factor != 1.0
            else "none"
        )
        notes.append(
            f"RoPE without YaRN scaling (the plan's model describes {described}): torchtitan's own "
            f"{'DeepSeek-V3' if spec.model_type == 'deepseek_v3' else 'gpt-oss'} flavors scale RoPE with YaRN "
            "for long context; set scaling='yarn' in _planner_flavor's RoPE to continue such a checkpoint"
        )
    if spec.mtp_modules:
        notes.append(
            f"mtp_modules={spec.mtp_modules}: torchtitan's MTP layers (model_registry num_mtp_layers) and "
            "MTPLoss (its mtp_scale 0.3; the plan carries no MTP loss weight), which computes whole-sequence "
            "logits (no ChunkedLossWrapper)"
        )
    if spec.model_type == "gpt_oss":
        notes.append(
            "gpt-oss experts: torchtitan's GptOssGroupedExperts (gpt-oss's clamped SwiGLU, alpha 1.702, limit "
            "7, with biases): the weights the plan counts, gpt-oss's own activation"
        )
        if cfg.cp > 1:
            notes.append(
                "cp > 1: the job uses FlexAttention (torchtitan's gpt-oss default varlen attention has no "
                "context parallelism: distributed/context_parallel/api.py)"
            )
    return notes


def _flavor(spec) -> str | None:
    """torchtitan's llama3 flavor with exactly this shape, else None (a custom llama3 model)."""
    shape = (
        spec.layers,
        spec.hidden,
        spec.heads,
        spec.n_kv_heads,
        spec.d_ffn,
        spec.vocab,
        spec.tied_embeddings,
    )
    for name, flavor_shape in TORCHTITAN_LLAMA3_FLAVORS.items():
        if (
            shape == flavor_shape
            and spec.d_head == spec.hidden // spec.heads
            and spec.rope_theta == 500000
        ):
            return name
    return None


def _py(value) -> str:
    return repr(value)


def torchtitan_family(spec) -> str:
    """Which model the job builds: one of torchtitan's MoE families (its model_type: deepseek_v3, qwen3_moe,
    gpt_oss), torchtitan's llama3, or the GPT model the job defines itself (planner.exports.torchtitan_models);
    the limits refuse everything else."""
    if spec.moe is not None and spec.model_type in TORCHTITAN_MOE_FAMILIES:
        return spec.model_type
    if spec.moe is None and spec.model_type in TORCHTITAN_DENSE_FAMILIES:
        return spec.model_type
    return "gpt" if spec.position == "learned" else "llama3"


def _models_source() -> list[str]:
    """The model code the job carries (planner/exports/torchtitan_models.py, read as text)."""
    return (
        Path(__file__).with_name("torchtitan_models.py").read_text().rstrip("\n") + "\n"
    ).splitlines()


def _model_lines(plan: Plan, spec, family, flavor) -> tuple[list[str], list[str]]:
    """(code before the job function, lines in it that set config.model_spec)."""
    cfg = plan.config
    converters = "[Float8LinearConverter.Config()]" if cfg.precision == "fp8" else "None"
    tied_pp = spec.tied_embeddings and cfg.pp > 1
    if family in TORCHTITAN_MOE_FAMILIES:
        return _moe_flavor(plan, spec), _moe_registry_lines(plan, spec)
    if family == "qwen3":
        return _qwen3_dense_lines(spec, max(cfg.seq, spec.seq)), [
            f"    config.model_spec = qwen3.model_registry('planner', converters={converters})"
        ]
    if family == "gpt":
        prelude = [""] + _models_source()
        body = [
            "    model = gpt_config(",
            f"        vocab={spec.vocab}, dim={spec.hidden}, n_layers={spec.layers}, n_heads={spec.heads},",
            f"        head_dim={spec.d_head}, hidden_dim={spec.d_ffn}, n_positions={max(cfg.seq, spec.n_positions)},",
            f"        tied={spec.tied_embeddings})",
        ]
        if cfg.precision == "fp8":
            body.append("    model = Float8LinearConverter.Config().build().convert(model)")
        body.append(f"    config.model_spec = tied_model_spec('gpt', {spec.name!r}, model)")
        return prelude, body
    prelude = [] if flavor is not None else _custom_flavor(spec, cfg.seq)
    name = flavor or "planner"
    body = [f"    config.model_spec = llama3.model_registry({name!r}, converters={converters})"]
    if tied_pp:
        prelude = (
            prelude
            + [""]
            + _models_source()
            + [
                "",
                "",
                "class TiedLlama3Model(llama3.Llama3Model):",
                '    """torchtitan\'s llama3 model whose tied table may sit on two pipeline stages."""',
                "",
                "    @dataclass(kw_only=True, slots=True)",
                "    class Config(llama3.Llama3Model.Config):",
                "        def update_from_config(self, *, config, **kwargs) -> None:",
                "            tied, self.enable_weight_tying = self.enable_weight_tying, False   # skip the PP refusal",
                "            try:",
                "                llama3.Llama3Model.Config.update_from_config(self, config=config, **kwargs)",
                "            finally:",
                "                self.enable_weight_tying = tied",
                "",
                "    def init_states(self, *, buffer_device=None) -> None:",
                "        init_tied_states(self, buffer_device=buffer_device)",
            ]
        )
        body += [
            "    model = config.model_spec.model",
            "    model = TiedLlama3Model.Config(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model)})",
            f"    config.model_spec = tied_model_spec('llama3', {name!r}, model)",
        ]
    return prelude, body


def _module_text(plan: Plan, spec, family, flavor, training, parallelism, ac, steps) -> str:
    """The job module: docstring, imports, model code, and planner_job() setting the model, loss,
    training, parallelism, activation checkpointing and checkpoint interval."""
    prelude, body = _model_lines(plan, spec, family, flavor)
    if ac.startswith("FirstBlocksAC"):
        prelude = _first_blocks_ac_source() + prelude
    lines = _module_head(plan, spec, family, flavor) + prelude
    lines += ["", "", "def planner_job():", "    config = base_job()", *body]
    lines += _loss_lines(spec)
    lines += ["    config.training = TrainingConfig("]
    lines += [f"        {k}={_py(v)}," for k, v in training.items()]
    lines += ["        steps=config.training.steps,", "    )"]
    lines += _parallelism_lines(parallelism)
    lines += [f"    config.activation_checkpoint = {ac}"]
    if steps:
        lines.append(
            f"    config.checkpoint.interval = {steps}  # plan.checkpoint_interval_s / predicted step time"
        )
    lines += ["    return config", ""]
    return "\n".join(lines)


def _module_head(plan: Plan, spec, family, flavor) -> list[str]:
    """The module docstring (how to run it) and its imports."""
    module = "planner_job"
    lines = [
        '"""' + "\n".join(header(plan, "torchtitan 0.3.0 job")),
        "",
        f"Save as {module}.py and run (module and config names as here):",
        f"  PYTHONPATH=. torchrun --nnodes {plan.nodes} --nproc_per_node {devices_per_node(plan)} "
        f"-m torchtitan.train --module {module} --config planner_job",
        "Set hf_assets_path (tokenizer), the dataset, optimizer and steps for your run (here: torchtitan's defaults",
        "of the job this one starts from); the model, batch and parallelism are the plan's.",
        '"""',
        "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
        "from torchtitan.config import ParallelismConfig, TrainingConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
    ]
    lines += _model_imports(spec, family, flavor)
    if plan.config.precision == "fp8":
        lines.append(
            "from torchtitan.components.quantization import Float8LinearConverter"
            + (", Float8GroupedExpertsConverter" if family in TORCHTITAN_MOE_FAMILIES else "")
        )
    return lines + [""]


def _model_imports(spec, family, flavor) -> list[str]:
    """The model package, its vocabulary helper and the job this one starts from."""
    if family in TORCHTITAN_MOE_FAMILIES or family in TORCHTITAN_DENSE_FAMILIES:
        package, _, _, job = {**TORCHTITAN_MOE_FAMILIES, **TORCHTITAN_DENSE_FAMILIES}[family]
        lines = [
            f"from torchtitan.models import {package}",
            "from torchtitan.models.common.config_utils import decoder_vocab_size",
            f"from torchtitan.models.{package}.config_registry import {job} as base_job",
        ]
        if spec.mtp_modules:
            lines.append("from torchtitan.models.deepseek_v3.mtp import MTPLoss")
        return lines
    return [
        "from torchtitan.models import llama3",
        "from torchtitan.models.common.config_utils import decoder_vocab_size",
        "from torchtitan.models.llama3.config_registry import "
        f"{_JOB_OF_FLAVOR.get(flavor, 'llama3_8b')} as base_job",
    ]


def _loss_lines(spec) -> list[str]:
    """MTPLoss with MTP modules, else the chunked cross-entropy."""
    if spec.mtp_modules:
        return [
            "    config.loss = MTPLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))"
        ]
    return [
        "    config.loss = ChunkedLossWrapper.Config(",
        "        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec)))",
    ]


def _parallelism_lines(parallelism: dict[str, object]) -> list[str]:
    """The ParallelismConfig call, module names per model part one part a line."""
    lines = ["    config.parallelism = ParallelismConfig("]
    lines += [
        f"        {k}={_py(v)},"
        for k, v in parallelism.items()
        if k != "module_fqns_per_model_part"
    ]
    if "module_fqns_per_model_part" in parallelism:
        lines.append("        module_fqns_per_model_part=[")
        lines += [f"            {part!r}," for part in parallelism["module_fqns_per_model_part"]]
        lines.append("        ],")
    return lines + ["    )"]


def _first_blocks_ac_source() -> list[str]:
    """A FullAC that wraps only the first `blocks` transformer blocks of each model part (pipeline stage): the plan's
    recompute_layers, as Megatron-Core's 'block' method; torchtitan's policy classes are built from their Config
    (Configurable) and applied to each model part by parallelize_fn."""
    return [
        "",
        "from dataclasses import dataclass",
        "",
        "",
        "class FirstBlocksAC(FullAC):",
        '    """Full recomputation of the first `blocks` transformer blocks of each model part; the others keep their',
        '    activations (the plan\'s recompute_layers)."""',
        "",
        "    @dataclass(kw_only=True, slots=True)",
        "    class Config(FullAC.Config):",
        "        blocks: int = 1",
        "",
        "    def apply(self, model):",
        '        layers = model.get_submodule("layers")',
        "        for layer_id, block in list(layers.named_children())[: self.config.blocks]:",
        '            layers.register_module(layer_id, self._wrap_block(block, base_fqn=f"layers.{layer_id}"))',
    ]


def _custom_flavor(spec, seq: int) -> list[str]:
    """A llama3 flavor of the plan's shape, built the way torchtitan builds its own flavors."""
    return [
        "",
        'def _planner_flavor(attn_backend, tp_gemm_backend="default"):',
        f'    """{spec.name}: the plan\'s shape as a torchtitan llama3 model (as torchtitan\'s own flavors are built)."""',
        "    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
        f"    dim, vocab = {spec.hidden}, {spec.vocab}",
        "    return llama3.Llama3Model.Config(",
        "        dim=dim,",
        "        vocab_size=vocab,",
        f"        enable_weight_tying={spec.tied_embeddings},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT),",
        "        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)),",
        "        layers=llama3._build_llama3_layers(",
        f"            fuse_qkv=True, n_layers={spec.layers}, dim=dim, n_heads={spec.heads}, n_kv_heads={spec.n_kv_heads},",
        f"            hidden_dim={spec.d_ffn},",
        f"            rope=ComplexRoPE.Config(dim={spec.d_head}, max_seq_len={max(seq, spec.seq)}, theta={float(spec.rope_theta)!r}),",
        "            attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend,",
        "        ),",
        "    )",
        "",
        "",
        'llama3.llama3_configs["planner"] = _planner_flavor',
    ]


def _qwen3_dense_lines(spec, max_seq: int) -> list[str]:
    """torchtitan/models/qwen3/__init__.py: _8b's recipe (_build_qwen3_layers: fused QKV, QK-norm, any head_dim;
    Qwen3Model.Config) with the plan's numbers, registered as `planner` in qwen3's registry."""
    embedding = "qwen3._EMBEDDING_SKIP_INIT" if spec.tied_embeddings else "qwen3._EMBEDDING_INIT"
    return [
        "",
        "def _planner_flavor(attn_backend):",
        f'    """{spec.name}: the plan\'s shape as a torchtitan dense Qwen3 model, built as torchtitan\'s own flavors are',
        '    (torchtitan/models/qwen3/__init__.py: _8b, _build_qwen3_layers)."""',
        "    from torchtitan.models.common import CosSinRoPE, Embedding, Linear",
        f"    dim, vocab = {spec.hidden}, {spec.vocab}",
        "    return qwen3.Qwen3Model.Config(",
        f"        vocab_size=vocab, dim=dim, enable_weight_tying={spec.tied_embeddings}, norm=qwen3._qwen3_norm(dim),",
        f"        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init={embedding}),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=qwen3._LINEAR_INIT),",
        "        layers=qwen3._build_qwen3_layers(",
        f"            fuse_qkv=True, n_layers={spec.layers}, dim=dim, n_heads={spec.heads}, n_kv_heads={spec.n_kv_heads},",
        f"            head_dim={spec.d_head}, hidden_dim={spec.d_ffn}, attn_backend=attn_backend,",
        f"            rope=CosSinRoPE.Config(dim={spec.d_head}, max_seq_len={max_seq}, theta={float(spec.rope_theta)!r}),",
        "        ),",
        "    )",
        "",
        "",
        'qwen3.qwen3_configs["planner"] = _planner_flavor',
    ]


def _moe_registry_lines(plan: Plan, spec) -> list[str]:
    """The job's line that sets config.model_spec: the family's model_registry on the `planner` flavor."""
    cfg, family = plan.config, spec.model_type
    package = TORCHTITAN_MOE_FAMILIES[family][0]
    args = ["'planner'", f"moe_comm_backend={_comm_backend(plan)!r}"]
    if family == "deepseek_v3" and spec.mtp_modules:
        args.append(f"num_mtp_layers={spec.mtp_modules}")
    if family == "gpt_oss" and cfg.cp > 1:
        args.append("attn_backend='flex'")  # varlen attention has no context parallelism
    if cfg.precision == "fp8":  # as torchtitan's deepseek_v3_671b_float8 (config_registry.py)
        args.append(
            "converters=[Float8LinearConverter.Config(filter_fqns=['router.gate']), "
            "Float8GroupedExpertsConverter.Config()]"
        )
    return [f"    config.model_spec = {package}.model_registry({', '.join(args)})"]


def _comm_backend(plan: Plan) -> str:
    """torchtitan's moe_comm_backend for the plan's dispatcher: DeepEP with expert parallelism unless the experts
    run in FP8 (Float8GroupedExpertsConverter pads through the all-to-all or HybridEP dispatchers only)."""
    dispatcher = (plan.document.get("software") or {}).get("moe_dispatcher", "alltoall")
    if plan.config.ep == 1 or plan.config.precision == "fp8":
        return "standard"
    return MOE_COMM_BACKENDS.get(dispatcher, "standard")


def _moe_flavor(plan: Plan, spec) -> list[str]:
    """A flavor of the plan's shape in its torchtitan MoE family, built the way torchtitan builds its own
    flavors (the family's layer builder and inits), registered as `planner` in the family's registry."""
    cfg, moe = plan.config, spec.moe
    max_seq = max(cfg.seq, spec.seq)
    limited = bool(moe.groups_per_token) and moe.expert_groups > 1
    router = {
        "score_func": moe.router,
        "route_norm": moe.normalize_top_k,
        "route_scale": float(moe.routed_scaling),
        "num_expert_groups": moe.expert_groups if limited else None,
        "num_limited_groups": moe.groups_per_token if limited else None,
        "gate.bias": moe.router_bias,
    }
    build = {
        "deepseek_v3": _deepseek_v3_lines,
        "qwen3_moe": _qwen3_moe_lines,
        "gpt_oss": _gpt_oss_lines,
    }
    return build[spec.model_type](spec, max_seq, router)


def _deepseek_v3_lines(spec, max_seq: int, router: dict) -> list[str]:
    """torchtitan/models/deepseek_v3/__init__.py: _671b's recipe (_build_dsv3_layers = build_mla_moe_layers with
    DeepSeek-V3's inits, DeepSeekV3Model.Config, _build_mtp_layers) with the plan's numbers."""
    moe, mla = spec.moe, spec.mla
    shared = _dsv3_shared_expert_lines(moe)
    patches = _moe_patches(
        ["        layer.moe.router.gate.bias = True"] if moe.router_bias else [],
        shared,
        "a gate without bias; shared experts num_shared_experts x moe_hidden_dim wide",
    )
    return [
        "",
        "def _planner_flavor(attn_backend, moe_comm_backend, non_blocking_capacity_factor=None, num_mtp_layers=0):",
        f'    """{spec.name}: the plan\'s shape as a torchtitan DeepSeek-V3 model, built as torchtitan\'s own flavors are',
        '    (torchtitan/models/deepseek_v3/__init__.py: _671b, build_mla_moe_layers, _build_mtp_layers)."""',
        "    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
        *(
            ["    from torchtitan.models.common.config_utils import make_ffn_config"]
            if len(shared) > 1
            else []
        ),
        f"    dim, vocab = {spec.hidden}, {spec.vocab}",
        "    layers = deepseek_v3._build_dsv3_layers(",
        f"        n_layers={spec.layers}, n_dense_layers={moe.first_dense_layers}, dim=dim, n_heads={spec.heads},",
        f"        q_lora_rank={mla.q_lora_rank}, kv_lora_rank={mla.kv_lora_rank}, qk_nope_head_dim={mla.qk_nope_head_dim},",
        f"        qk_rope_head_dim={mla.qk_rope_head_dim}, v_head_dim={mla.v_head_dim}, mscale=1.0,",
        f"        dense_hidden_dim={spec.d_ffn}, moe_hidden_dim={moe.expert_ffn}, num_experts={moe.experts}, "
        f"num_shared_experts={moe.shared_experts},",
        f"        router_top_k={moe.top_k}, router_score_func={router['score_func']!r}, "
        f"router_route_norm={router['route_norm']}, router_route_scale={router['route_scale']!r},",
        f"        router_num_expert_groups={router['num_expert_groups']}, "
        f"router_num_limited_groups={router['num_limited_groups']},",
        "        attn_backend=attn_backend, moe_comm_backend=moe_comm_backend,",
        "        non_blocking_capacity_factor=non_blocking_capacity_factor,",
        f"        rope=ComplexRoPE.Config(dim={mla.qk_rope_head_dim}, max_seq_len={max_seq}, "
        f"theta={float(spec.rope_theta)!r}),",
        "    )",
        *patches,
        "    return deepseek_v3.DeepSeekV3Model.Config(",
        f"        vocab_size=vocab, dim=dim, enable_weight_tying={spec.tied_embeddings},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, "
        "param_init=deepseek_v3._EMBEDDING_INIT),",
        "        norm=RMSNorm.Config(normalized_shape=dim, param_init=deepseek_v3._NORM_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, "
        "param_init=deepseek_v3._output_linear_init(dim)),",
        "        layers=layers,",
        "        mtp_layers=deepseek_v3._build_mtp_layers(layers[-1], dim=dim, num_mtp_layers=num_mtp_layers),",
        "    )",
        "",
        "",
        'deepseek_v3.deepseekv3_configs["planner"] = _planner_flavor',
    ]


def _dsv3_shared_expert_lines(moe) -> list[str]:
    """Shared-expert patches of a DeepSeek-V3 layer: none, or a width other than
    num_shared_experts x moe_hidden_dim."""
    if moe.shared_experts == 0:
        return ["        layer.moe.shared_experts = None"]
    if moe.d_shared_ffn != moe.expert_ffn:
        return [
            "        layer.moe.shared_experts = make_ffn_config(",
            f"            dim=dim, hidden_dim={moe.shared_experts * moe.d_shared_ffn}, "
            "w1_param_init=deepseek_v3._LINEAR_INIT,",
            "            w2w3_param_init=deepseek_v3._depth_init(layer_id))",
        ]
    return []


def _qwen3_moe_lines(spec, max_seq: int, router: dict) -> list[str]:
    """torchtitan/models/qwen3/__init__.py: _30b_a3b's recipe (_build_qwen3_moe_layers: fused QKV, QK-norm,
    a softmax router renormalized over the top k, no shared experts; Qwen3Model.Config) with the plan's numbers."""
    moe = spec.moe
    shared = (
        [
            "        layer.moe.shared_experts = make_ffn_config(",
            f"            dim=dim, hidden_dim={moe.shared_experts * moe.d_shared_ffn}, "
            "w1_param_init=qwen3._LINEAR_INIT, w2w3_param_init=qwen3._LINEAR_INIT)",
        ]
        if moe.shared_experts
        else []
    )
    patches = _moe_patches(
        _qwen3_router_lines(router),
        shared,
        "a softmax router renormalized over the top k, no scaling, groups or "
        "gate bias; no shared experts",
    )
    embedding = "qwen3._EMBEDDING_SKIP_INIT" if spec.tied_embeddings else "qwen3._EMBEDDING_INIT"
    return [
        "",
        'def _planner_flavor(attn_backend, moe_comm_backend="standard"):',
        f'    """{spec.name}: the plan\'s shape as a torchtitan Qwen3 MoE model, built as torchtitan\'s own flavors are',
        '    (torchtitan/models/qwen3/__init__.py: _30b_a3b, _build_qwen3_moe_layers)."""',
        "    from torchtitan.models.common import CosSinRoPE, Embedding, Linear",
        *(
            ["    from torchtitan.models.common.config_utils import make_ffn_config"]
            if shared
            else []
        ),
        f"    dim, vocab = {spec.hidden}, {spec.vocab}",
        "    layers = qwen3._build_qwen3_moe_layers(",
        f"        fuse_qkv=True, n_layers={spec.layers}, dim=dim, n_heads={spec.heads}, n_kv_heads={spec.n_kv_heads}, "
        f"head_dim={spec.d_head},",
        f"        moe_hidden_dim={moe.expert_ffn}, num_experts={moe.experts}, top_k={moe.top_k},",
        "        attn_backend=attn_backend, moe_comm_backend=moe_comm_backend,",
        f"        rope=CosSinRoPE.Config(dim={spec.d_head}, max_seq_len={max_seq}, theta={float(spec.rope_theta)!r}),",
        "    )",
        *patches,
        "    return qwen3.Qwen3Model.Config(",
        f"        vocab_size=vocab, dim=dim, enable_weight_tying={spec.tied_embeddings}, norm=qwen3._qwen3_norm(dim),",
        f"        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init={embedding}),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=qwen3._LINEAR_INIT),",
        "        layers=layers,",
        "    )",
        "",
        "",
        'qwen3.qwen3_configs["planner"] = _planner_flavor',
    ]


def _qwen3_router_lines(router: dict) -> list[str]:
    """Router settings that differ from torchtitan's Qwen3 MoE router."""
    fixed = {
        "score_func": "softmax",
        "route_norm": True,
        "route_scale": 1.0,
        "num_expert_groups": None,
        "num_limited_groups": None,
        "gate.bias": False,
    }
    return [
        f"        layer.moe.router.{name} = {router[name]!r}"
        for name in fixed
        if router[name] != fixed[name]
    ]


def _gpt_oss_lines(spec, max_seq: int, router: dict) -> list[str]:
    """torchtitan/models/gpt_oss/__init__.py: _120b's recipe, the loop of _build_gptoss_layers (which fixes 64
    heads, 8 KV heads, head_dim 64 and a 128-token window on even blocks) over _make_gptoss_attn_config and
    _make_gptoss_experts_config with the plan's heads, windows and router."""
    moe = spec.moe
    windowed = [i for i in range(spec.layers) if spec.windowed(i)]
    window = f"{spec.sliding_window} if layer_id in windowed else None" if windowed else "None"
    groups = (
        ""
        if router["num_expert_groups"] is None
        else f" num_expert_groups={router['num_expert_groups']}, num_limited_groups={router['num_limited_groups']},"
    )
    return [
        "",
        'def _planner_flavor(moe_comm_backend, attn_backend="varlen"):',
        f'    """{spec.name}: the plan\'s shape as a torchtitan gpt-oss model, built as torchtitan\'s own flavors are',
        '    (torchtitan/models/gpt_oss/__init__.py: _120b, _build_gptoss_layers with the plan\'s heads and windows)."""',
        "    from torchtitan.models.common import CosSinRoPE, Embedding, Linear, RMSNorm",
        "    from torchtitan.models.common.moe import TokenChoiceTopKRouter",
        "    from torchtitan.models.gpt_oss.model import GptOssTransformerBlock",
        "    from torchtitan.models.gpt_oss.moe import GptOssMoE",
        f"    dim, vocab, num_experts, top_k = {spec.hidden}, {spec.vocab}, {moe.experts}, {moe.top_k}",
        f"    rope = CosSinRoPE.Config(dim={spec.d_head}, max_seq_len={max_seq}, theta={float(spec.rope_theta)!r})",
        f"    windowed = {_ranges(windowed)}",
        "    layers = []",
        f"    for layer_id in range({spec.layers}):",
        "        layers.append(GptOssTransformerBlock.Config(",
        "            attention=gpt_oss._make_gptoss_attn_config(",
        "                dim=dim, layer_id=layer_id, attn_backend=attn_backend, "
        f"n_heads={spec.heads}, n_kv_heads={spec.n_kv_heads}, head_dim={spec.d_head},",
        f"                sliding_window_size={window}, fuse_qkv=True, rope=rope),",
        "            attention_norm=RMSNorm.Config(normalized_shape=dim, param_init=gpt_oss._NORM_INIT),",
        "            ffn_norm=RMSNorm.Config(normalized_shape=dim, param_init=gpt_oss._NORM_INIT),",
        "            moe=GptOssMoE.Config(",
        f"                num_experts=num_experts, load_balance_coeff={LOAD_BALANCE_COEFF},",
        "                routed_experts=gpt_oss._make_gptoss_experts_config(",
        f"                    dim=dim, hidden_dim={moe.expert_ffn}, num_experts=num_experts, layer_id=layer_id, "
        "top_k=top_k,",
        "                    moe_comm_backend=moe_comm_backend),",
        "                router=TokenChoiceTopKRouter.Config(",
        f"                    num_experts=num_experts, top_k=top_k, score_func={router['score_func']!r}, "
        f"route_norm={router['route_norm']}, route_scale={router['route_scale']!r},{groups}",
        f"                    gate=Linear.Config(in_features=dim, out_features=num_experts, bias={router['gate.bias']},",
        "                                       param_init=gpt_oss._depth_init(layer_id))),",
        "            ),",
        "        ))",
        "    return gpt_oss.GptOssModel.Config(",
        f"        dim=dim, vocab_size=vocab, enable_weight_tying={spec.tied_embeddings},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, "
        "param_init=gpt_oss._EMBEDDING_INIT),",
        "        norm=RMSNorm.Config(normalized_shape=dim, param_init=gpt_oss._NORM_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=gpt_oss._output_linear_init(dim)),",
        "        layers=layers,",
        "    )",
        "",
        "",
        'gpt_oss.gptoss_configs["planner"] = _planner_flavor',
    ]


def _ranges(indices: list[int]) -> str:
    """Python text for a set of block indices (a range when they are evenly spaced)."""
    if len(indices) > 2 and len({b - a for a, b in zip(indices, indices[1:])}) == 1:
        step = indices[1] - indices[0]
        return f"set(range({indices[0]}, {indices[-1] + 1}, {step}))"
    return "{" + ", ".join(map(str, indices)) + "}" if indices else "set()"


def _moe_patches(router_lines: list[str], shared_lines: list[str], fixed: str) -> list[str]:
    """Lines that set, on every MoE block the family's builder made, what the plan has and the builder fixes."""
    if not router_lines and not shared_lines:
        return []
    return [
        "    # the plan's router and shared experts, where torchtitan's builder fixes them:",
        f"    # {fixed}",
        "    for layer_id, layer in enumerate(layers):",
        "        if layer.moe is None:",
        "            continue",
        *router_lines,
        *shared_lines,
    ]
