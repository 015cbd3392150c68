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
(torchtitan/models/llama3/__init__.py); pipeline schedules of torch.distributed.pipelining.
"""
from __future__ import annotations

from pathlib import Path

from planner.exports.common import (Export, cannot, chunk_blocks, devices_per_node, dp_replicas, header,
                                    require_spec, steps_between_checkpoints)
from planner.exports.limits import torchtitan_limits
from planner.plan import Plan

SPMD_BACKEND = "partial_dtensor"
"""torchtitan's DTensor backend for the model-parallel axes (ParallelismConfig.spmd_backend)."""

TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                        "zero-bubble": "InterleavedZeroBubble"}
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
    local_batch = cfg.global_batch // cfg.dp

    parallelism: dict[str, object] = {}
    if cfg.zero == 0:
        parallelism.update(data_parallel_replicate_degree=cfg.dp, data_parallel_shard_degree=1)
    else:
        parallelism.update(data_parallel_replicate_degree=dp_replicas(plan), data_parallel_shard_degree=cfg.shard_group,
                           fsdp_reshard_after_forward="default" if cfg.zero == 3 else "never")
        if cfg.zero == 1:
            notes.append("torchtitan has no optimizer-only sharding (ZeRO-1); exported as FSDP2 without resharding "
                         "after forward (ZeRO-2): same parameters in memory, less gradient memory")
    parallelism.update(tensor_parallel_degree=cfg.tp, enable_sequence_parallel=cfg.tp > 1,
                       pipeline_parallel_degree=cfg.pp, context_parallel_degree=cfg.cp,
                       spmd_backend=SPMD_BACKEND)
    notes.append(f"parallelism.spmd_backend={SPMD_BACKEND!r}: torchtitan 0.3.0's default 'spmd_types' hands FSDP2 "
                 "plain tensors with SPMD annotations, which torch 2.13.0's fully_shard refuses with data and tensor "
                 "parallelism (it needs a newer torch); the DTensor backend shards the same way")
    if cfg.tp > 1 and not cfg.sequence_parallel:
        notes.append("torchtitan applies sequence parallelism with TP (enable_sequence_parallel); the plan did not "
                     "(less activation memory)")
    if cfg.pp > 1:
        parallelism.update(pipeline_parallel_schedule=TORCHTITAN_SCHEDULES[cfg.schedule],
                           pipeline_parallel_microbatch_size=cfg.micro_batch,
                           module_fqns_per_model_part=torchtitan_fqns(chunk_blocks(plan), positions=family == "gpt"))
        if spec.tied_embeddings:
            notes.append("tied embeddings with pipeline parallelism (torchtitan's Decoder refuses them): the first and "
                         "last stages each hold the table, start from the last stage's values and add their gradients "
                         "before each optimizer step (Megatron-LM's scheme); torchtitan's gradient clipping sees the "
                         "two partial gradients")
    elif cfg.num_microbatches > 1:
        notes.append(f"pp=1: torchtitan runs local_batch_size={local_batch} in one forward; set "
                     f"local_batch_size={cfg.micro_batch} and global_batch_size={cfg.global_batch} on the command line to "
                     f"accumulate {cfg.num_microbatches} micro-batches if memory needs the plan's micro-batch")
    if cfg.cp > 1 and cfg.cp_comm != "all_gather":
        notes.append(f"cp_comm={cfg.cp_comm}: torchtitan's context parallelism (torch's context_parallel) gathers "
                     "keys/values (all_gather) unless the script sets torch's rotate method; same result")
    if cfg.cp > 1 and cfg.zero >= 1:
        notes.append("torchtitan shards FSDP over dp_shard x cp ranks (more sharding than planned: less memory)")
    if cfg.offloads("optimizer"):
        notes.append("offload=optimizer exported as FSDP2 CPU offload (parameters, gradients and optimizer states "
                     "on the host: less GPU memory, more host traffic)")
    if cfg.placement.replace("C", "") != "PDT":
        notes.append(f"torchtitan orders its mesh pp, dp_replicate, dp_shard, cp, tp (placement PDT); placement "
                     f"{cfg.placement} is not expressible (same result, other links)")
    if cfg.recompute == "selective":
        notes.append("recompute=selective exported as torchtitan's per-op SelectiveAC (saves matmul outputs, recomputes "
                     "the rest): close to, not the same as, Megatron's attention-core recompute")
    training = {"local_batch_size": local_batch, "global_batch_size": cfg.global_batch, "seq_len": cfg.seq,
                "dtype": "bfloat16" if cfg.precision == "bf16" else "float32",
                "mixed_precision_param": "float32" if cfg.precision == "fp32" else "bfloat16",
                "enable_cpu_offload": cfg.offloads("optimizer"),
                "disable_cuda_graphs": cfg.pp > 1}
    if cfg.pp > 1:
        notes.append("training.disable_cuda_graphs = True: torchtitan 0.3.0 has no CUDA graphs with pipeline parallelism")
    ac = {"none": "None", "full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}[cfg.recompute]
    steps = steps_between_checkpoints(plan)
    if cfg.precision == "fp8":
        notes.append("fp8: torchtitan's Float8LinearConverter (torchao rowwise recipe) on every Linear; "
                     "needs torchao and an SM89+ GPU; add --compile.enable for speed")
    if family == "gpt":
        notes.append("the job defines the GPT model itself (torchtitan 0.3.0 has none): token + learned position "
                     "embeddings, pre-LayerNorm blocks with biases and a GELU MLP, parallelized by torchtitan's llama3 "
                     "functions; no Hugging Face checkpoint adapter (state_dict_adapter None)")
    text = _module_text(plan, spec, family, flavor, training, parallelism, ac, steps)
    return Export(format="torchtitan", text=text, notes=tuple(notes))


def _flavor(spec) -> str | None:
    """torchtitan's llama3 flavor with exactly this shape, else None (a custom llama3 model)."""
    shape = (spec.layers, spec.hidden, spec.heads, spec.n_kv_heads, spec.d_ffn, spec.vocab, spec.tied_embeddings)
    for name, flavor_shape in TORCHTITAN_LLAMA3_FLAVORS.items():
        if shape == flavor_shape and spec.d_head == spec.hidden // spec.heads and spec.rope_theta == 500000:
            return name
    return None


def _py(value) -> str:
    return repr(value)


def torchtitan_family(spec) -> str:
    """Which model the job builds: torchtitan's llama3, or the GPT model the job defines itself
    (planner.exports.torchtitan_models); the limits refuse everything else."""
    return "gpt" if spec.position == "learned" else "llama3"


def _models_source() -> list[str]:
    """The model code the job carries (planner/exports/torchtitan_models.py, read as text)."""
    return (Path(__file__).with_name("torchtitan_models.py").read_text().rstrip("\n") + "\n").splitlines()


def _model_lines(plan: Plan, spec, family, flavor) -> tuple[list[str], list[str]]:
    """(code before the job function, lines in it that set config.model_spec)."""
    cfg = plan.config
    converters = "[Float8LinearConverter.Config()]" if cfg.precision == "fp8" else "None"
    tied_pp = spec.tied_embeddings and cfg.pp > 1
    if family == "gpt":
        prelude = [""] + _models_source()
        body = ["    model = gpt_config(",
                f"        vocab={spec.vocab}, dim={spec.hidden}, n_layers={spec.layers}, n_heads={spec.heads},",
                f"        head_dim={spec.d_head}, hidden_dim={spec.d_ffn}, n_positions={max(cfg.seq, spec.n_positions)},",
                f"        tied={spec.tied_embeddings})"]
        if cfg.precision == "fp8":
            body.append("    model = Float8LinearConverter.Config().build().convert(model)")
        body.append(f"    config.model_spec = tied_model_spec('gpt', {spec.name!r}, model)")
        return prelude, body
    prelude = [] if flavor is not None else _custom_flavor(spec, cfg.seq)
    name = flavor or "planner"
    body = [f"    config.model_spec = llama3.model_registry({name!r}, converters={converters})"]
    if tied_pp:
        prelude = prelude + [""] + _models_source() + [
            "",
            "",
            "class TiedLlama3Model(llama3.Llama3Model):",
            "    \"\"\"torchtitan's llama3 model whose tied table may sit on two pipeline stages.\"\"\"",
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
            "        init_tied_states(self, buffer_device=buffer_device)"]
        body += ["    model = config.model_spec.model",
                 "    model = TiedLlama3Model.Config(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model)})",
                 f"    config.model_spec = tied_model_spec('llama3', {name!r}, model)"]
    return prelude, body


def _module_text(plan: Plan, spec, family, flavor, training, parallelism, ac, steps) -> str:
    cfg = plan.config
    module = "planner_job"
    lines = ['"""' + "\n".join(header(plan, "torchtitan 0.3.0 job")),
             "",
             f"Save as {module}.py and run (module and config names as here):",
             f"  PYTHONPATH=. torchrun --nnodes {plan.nodes} --nproc_per_node {devices_per_node(plan)} "
             f"-m torchtitan.train --module {module} --config planner_job",
             "Set hf_assets_path (tokenizer), the dataset, optimizer and steps for your run (here: torchtitan's defaults",
             f"of the job this one starts from); the model, batch and parallelism are the plan's.",
             '"""',
             "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
             "from torchtitan.config import ParallelismConfig, TrainingConfig",
             "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
             "from torchtitan.models import llama3",
             "from torchtitan.models.common.config_utils import decoder_vocab_size",
             f"from torchtitan.models.llama3.config_registry import {_JOB_OF_FLAVOR.get(flavor, 'llama3_8b')} as base_job"]
    if cfg.precision == "fp8":
        lines.append("from torchtitan.components.quantization import Float8LinearConverter")
    lines.append("")
    prelude, body = _model_lines(plan, spec, family, flavor)
    lines += prelude
    lines += ["",
              "",
              "def planner_job():",
              "    config = base_job()",
              *body,
              "    config.loss = ChunkedLossWrapper.Config(",
              "        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec)))",
              "    config.training = TrainingConfig(",
              *[f"        {k}={_py(v)}," for k, v in training.items()],
              "        steps=config.training.steps,",
              "    )",
              "    config.parallelism = ParallelismConfig(",
              *[f"        {k}={_py(v)}," for k, v in parallelism.items() if k != "module_fqns_per_model_part"],
              ]
    if "module_fqns_per_model_part" in parallelism:
        lines.append("        module_fqns_per_model_part=[")
        lines += [f"            {part!r}," for part in parallelism["module_fqns_per_model_part"]]
        lines.append("        ],")
    lines += ["    )",
              f"    config.activation_checkpoint = {ac}"]
    if steps:
        lines.append(f"    config.checkpoint.interval = {steps}  # plan.checkpoint_interval_s / predicted step time")
    lines += ["    return config", ""]
    return "\n".join(lines)


def _custom_flavor(spec, seq: int) -> list[str]:
    """A llama3 flavor of the plan's shape, built the way torchtitan builds its own flavors."""
    return [
        "",
        "def _planner_flavor(attn_backend, tp_gemm_backend=\"default\"):",
        f"    \"\"\"{spec.name}: the plan's shape as a torchtitan llama3 model (as torchtitan's own flavors are built).\"\"\"",
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
        "llama3.llama3_configs[\"planner\"] = _planner_flavor",
    ]
