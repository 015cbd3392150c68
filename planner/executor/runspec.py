"""Plan document -> `RunSpec`: everything one rank needs to run the plan, decided once in the parent.

The parent (or every torchrun rank, deterministically) reads the plan, resolves the model, applies
the backend's limits (precision, offload, tied embeddings, the --proxy shrink) and records each
change as a note the output repeats. Workers receive the RunSpec as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import ConfigError
from planner.parallel import ParallelConfig
from planner.spec import TransformerSpec
from planner.executor.faults import bug, check_bug_applies, parse_fault
from planner.plan import load_plan

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """One executor run: the plan's parallel config on a concrete (possibly proxy) model."""

    config: ParallelConfig
    """The plan's parallel configuration (degrees, schedule, ZeRO, recompute, ...)."""
    model: TransformerSpec
    """The model actually built (the plan's, or its --proxy shrink)."""
    model_name: str
    """MODEL as written in the plan."""
    steps: int = 3
    """Optimizer steps to run (in total, counting steps restored from a checkpoint)."""
    seed: int = 0
    """Seed of the weight init (Transformer.init_weights) and of the synthetic token stream."""
    backend: str = "gloo"
    """torch.distributed backend: gloo (CPU processes) or nccl (one GPU per rank)."""
    dtype: str = "fp32"
    """Precision actually used: fp32, amp-bf16, amp-fp16 or bf16 (the plan's, or fp32 on CPU)."""
    lr: float = 1e-3
    """Learning rate of AdamW (SGD uses 10x, momentum 0.9)."""
    timeout_s: float = 60.0
    """Process-group timeout: a collective waiting longer than this fails on every live rank."""
    checkpoint_dir: str | None = None
    """torch.distributed.checkpoint directory; a run resumes from its latest complete step."""
    offload: str = "none"
    """Offload actually applied (none on CPU, where everything already lives in host memory)."""
    fault: str | None = None
    """Test-only fault switch (faults.parse_fault): 'kill|hang|stop:RANK:STEP' or 'bug:NAME' (a planted
    parallelization bug). Set by the hidden --inject-fault option, never from a plan file."""
    verify: bool = False
    """Record what verify.py compares (per-step gradients, sampled parameters)."""
    resume_step: int | None = None
    """Checkpoint step to resume from, chosen and validated by the launcher (None: start fresh)."""
    checkpoint_interval_s: float | None = None
    """Save a checkpoint whenever this much wall time has passed since the last one (the plan's
    checkpoint_interval_s); None: every step, unless checkpoint_every_steps is set."""
    checkpoint_every_steps: int | None = None
    """Save every N steps (--checkpoint-every-steps; overrides checkpoint_interval_s)."""
    notes: tuple[str, ...] = field(default=())
    """What differs from the plan as written (downgraded precision, proxy shrink, ...), for the output."""

    @property
    def device_type(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["config"] = {k: v for k, v in self.config.to_dict().items() if k != "num_microbatches"}
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        d = json.loads(text)
        cfg = dict(d.pop("config"))
        cfg["stages"] = tuple(cfg["stages"])
        model = dict(d.pop("model"))
        model["extras"] = tuple(tuple(x) for x in model.get("extras", ()))
        return cls(
            config=ParallelConfig(**cfg),
            model=TransformerSpec(**model),
            notes=tuple(d.pop("notes")),
            **d,
        )


def env_positive_int(name: str, *, minimum: int = 1) -> int | None:
    """An integer from the environment (at least `minimum`): None when unset or empty, ConfigError
    (one line naming the variable, its value and what is allowed) when it is anything else."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(name, raw, f"{allowed} (environment variable)")
    return value


def env_choice(name: str, allowed: tuple[str, ...]) -> str | None:
    """An environment override with a fixed set of values (None when unset or empty)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    if raw.strip() not in allowed:
        raise ConfigError(name, raw, "one of " + ", ".join(allowed) + " (environment variable)")
    return raw.strip()


def max_local_ranks(backend: str) -> int:
    """Processes one machine hosts: GPUs for nccl; for gloo max(8, 2 x cores) (PLANNER_MAX_LOCAL_RANKS overrides)."""
    if backend == "nccl":
        import torch

        return torch.cuda.device_count()
    env = env_positive_int("PLANNER_MAX_LOCAL_RANKS")
    return env if env is not None else max(8, 2 * (os.cpu_count() or 1))


EXECUTOR_RUNS = (
    "dp (DDP, FSDP2 ZeRO-1/2/3, HSDP with dp_shard), tp (+ sequence parallelism), pp (gpipe, 1f1b, "
    "interleaved-1f1b, zero-bubble), cp (p2p ring, all_gather, a2a Ulysses; load-balanced causal "
    "split), ep (routed experts over dp x cp ranks, tp 1), recompute; fp32 on CPU"
)
"""What the executor runs, for `planner run --help` and docs/executor.md."""


def fp8_substitute(backend: str) -> str:
    """The precision an FP8 plan runs in here: its non-FP8 arithmetic (bf16 with fp32 master weights:
    amp-bf16) on GPUs, where this executor has no FP8 GEMMs (Transformer Engine / torchao recipes);
    fp32 on CPU, as every CPU run."""
    return "fp32" if backend == "gloo" else "amp-bf16"


def fp8_line(backend: str) -> str:
    """The one line an FP8 plan's run prints on stderr."""
    if backend == "gloo":
        return "FP8 GEMMs need an FP8 device; this CPU run uses fp32 instead (as every CPU run of the executor)"
    return "FP8 GEMMs are not run by this executor; this run uses bf16 autocast (amp-bf16) instead"


def check_executable(config: ParallelConfig) -> None:
    """Degrees the executor cannot run, refused by name (one line, exit 2): expert tensor parallelism,
    and expert parallelism beside tensor parallelism (its expert layers regroup the tp ranks too,
    MoE parallel folding, which the executor does not build)."""
    if config.expert_tp != 1:
        raise ConfigError(
            "plan.expert_tp", config.expert_tp, "1 (the executor has no expert tensor parallelism)"
        )
    if config.ep > 1 and config.tp > 1:
        raise ConfigError(
            "plan.ep",
            config.ep,
            f"1 with tp({config.tp}) > 1 (the executor carves expert-parallel "
            "groups from dp x cp only; run ep with tp=1)",
        )


def check_model_executable(config: ParallelConfig, spec: TransformerSpec) -> None:
    """What the model must allow for the plan's cp and ep on the executor (one line, exit 2): context
    parallelism's sequence split (ParallelConfig.check_sequence) over plain softmax attention (no
    sliding windows or sinks), whole routed experts per ep rank (ParallelConfig.check_experts), and
    no mixture-of-experts model beside tensor parallelism."""
    if config.cp > 1:
        config.check_sequence(config.seq, heads=spec.heads, kv_heads=spec.n_kv_heads)
        if spec.sliding_window or spec.attention_sinks:
            raise ConfigError(
                "plan.cp",
                config.cp,
                "1 for a model with sliding-window attention or attention sinks "
                "(the executor's context-parallel attention is full causal softmax)",
            )
    config.check_experts(spec.moe)  # ep needs experts, and whole experts per rank
    if spec.moe is not None and config.tp > 1:
        raise ConfigError(
            "plan.tp",
            config.tp,
            "1 for a mixture-of-experts model (the executor's tensor "
            "parallelism splits dense MLPs only)",
        )


def resolve_transformer(name: str, seq: int | None) -> TransformerSpec:
    """The executor runs the planner's own Transformer: catalog / HF config via planner.sources,
    or a `package.module:factory` that returns a `planner.models.transformer.Transformer`."""
    if ":" in name and not Path(name).exists():
        spec = _factory_transformer(name)
    else:
        spec = _named_transformer(name, seq)
    if spec.encoder_layers:
        raise ConfigError(
            "model",
            name,
            "a decoder-only or encoder-only transformer (the executor has no "
            "encoder-decoder reference model)",
        )
    return spec


def _factory_transformer(name: str) -> TransformerSpec:
    """The spec of the planner Transformer a `package.module:factory` builds (on the meta device)."""
    import torch

    # optional heavy dependencies: planner.models.transformer and planner.module_profiler import
    # torch at their top
    from planner.models.transformer import Transformer
    from planner.module_profiler import load_factory

    try:
        # modules of the current directory too, as `python -m` finds them
        factory = load_factory(name)
    except ConfigError as err:
        raise ConfigError("model", name, f"an importable package.module:factory ({err})") from None
    try:
        with torch.device("meta"):  # only its .spec is needed here; the workers build it for real
            built = factory()
    except Exception as err:  # noqa: BLE001 - a user's factory failing is bad input, named in one line
        raise ConfigError(
            "model", name, f"a factory callable without arguments ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(built, Transformer):
        raise ConfigError(
            "model",
            name,
            "a factory returning planner.models.transformer.Transformer "
            "(the executor parallelizes that model by module name; other nn.Modules "
            "can be profiled and estimated, not run)",
        )
    return built.spec


def _named_transformer(name: str, seq: int | None) -> TransformerSpec:
    """A catalog name or Hugging Face config, resolved by planner.sources."""
    try:
        from planner.sources import resolve_model
    except ImportError:
        raise ConfigError(
            "model",
            name,
            "package.module:factory in this build (catalog and config sources are not installed)",
        ) from None
    spec = resolve_model(name, seq=seq)
    if not isinstance(spec, TransformerSpec):
        raise ConfigError(
            "model",
            name,
            "a transformer (catalog name or HF config) or a factory "
            "returning planner.models.transformer.Transformer",
        )
    return spec


def parameter_count(spec: TransformerSpec) -> int:
    # optional heavy dependency: planner.models.transformer imports torch at its top
    from planner.models.transformer import build_model

    return sum(p.numel() for p in build_model(spec, device="meta", seed=None).parameters())


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def training_bytes_on_host(spec: TransformerSpec, config: ParallelConfig) -> int:
    """Host memory the CPU run needs, roughly: every rank builds the full fp32 model once (4 B/param)
    before pruning to its shard, plus weights, gradients and two AdamW moments (16 B/param, ZeRO's
    accounting, Rajbhandari et al. 2020, sec. 3) and one micro-batch of logits per rank."""
    params = parameter_count(spec)
    logits = config.micro_batch * config.seq * spec.vocab * 4 * 3
    return config.world_size * (4 * params + logits) + 16 * params


def proxy_spec(
    spec: TransformerSpec, config: ParallelConfig
) -> tuple[TransformerSpec, ParallelConfig, str]:
    """Shrink width and depth, keeping every parallel degree, the schedule and the stage-split shape.

    Depth: the split keeps its shape: explicit stages are scaled to about one block per stage of the
    smallest (each at least 1); an even split of L blocks over S = pp*v stages becomes S + (L mod S)
    blocks, so the same leading stages carry the extra block. Width: 16-wide heads, as many query
    heads as needed for tp (and the grouped-query ratio where the plan has one), FFN ratio kept,
    a 512-token vocabulary and sequences of at most 64 tokens.
    """
    stages, layers = _proxy_depth(spec, config)
    width = _proxy_width(spec, config)
    seq = min(config.seq, 64)
    small = spec.with_(
        name=f"{spec.name} (proxy)",
        layers=layers,
        head_dim=0,
        seq=seq,
        max_positions=0,
        **width,
    )
    # recompute_layers counts blocks of a chunk: at most the proxy's largest chunk
    new_config = dataclasses.replace(config, seq=seq, stages=stages)
    if config.recompute_layers is not None:
        new_config = dataclasses.replace(
            new_config,
            recompute_layers=min(config.recompute_layers, new_config.largest_chunk(layers)),
        )
    note = (
        f"--proxy: {spec.name} is too large for this machine; ran a proxy with {layers} blocks, "
        f"hidden {width['hidden']}, {width['heads']} heads, ffn {width['ffn']}, "
        f"vocab {width['vocab']}, seq {seq} (stages {list(stages) or 'even'}), keeping "
        f"dp={config.dp} tp={config.tp} pp={config.pp} cp={config.cp} ep={config.ep} "
        f"v={config.virtual_stages}, schedule {config.schedule}, micro-batch {config.micro_batch}, "
        f"global batch {config.global_batch}"
    )
    return small, new_config, note


def _proxy_depth(spec: TransformerSpec, config: ParallelConfig) -> tuple[tuple[int, ...], int]:
    """(stages, blocks) of the proxy: explicit stages scaled to about one block per stage of the
    smallest, or S + (L mod S) blocks for an even split over S = pp*v stages."""
    chunks = config.pp * config.virtual_stages
    if config.stages:
        smallest = min(s for s in config.stages if s > 0) if any(config.stages) else 1
        stages = tuple(max(1, round(s / smallest)) for s in config.stages)
        return stages, sum(stages)
    return (), chunks + spec.total_blocks % chunks


def _proxy_width(spec: TransformerSpec, config: ParallelConfig) -> dict:
    """hidden, heads, kv_heads, ffn, vocab (and the narrower experts) of the proxy."""
    tp = config.tp * (
        config.cp if config.cp_comm == "a2a" else 1
    )  # Ulysses splits the heads over cp too
    grouped = spec.n_kv_heads < spec.heads
    # never wider than the original (its heads already divide by tp, check_model passed)
    heads = min(2 * tp if grouped else tp * math.ceil(4 / tp), spec.heads)
    kv_heads = min(tp, spec.n_kv_heads) if grouped else 0
    head_dim = min(16, spec.d_head)
    hidden = heads * head_dim
    ffn_ratio = spec.d_ffn / spec.hidden
    ffn = max(tp, int(round(ffn_ratio * hidden / tp)) * tp)
    tp = config.tp
    vocab = min(spec.vocab, 512 if 512 % tp == 0 else tp * math.ceil(512 / tp))
    width = dict(hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab)
    if spec.moe is not None:  # the same experts and routing, each as much narrower as the model
        narrower = lambda f: max(1, int(round(f * hidden / spec.hidden)))  # noqa: E731
        width["moe"] = dataclasses.replace(
            spec.moe,
            expert_ffn=narrower(spec.moe.expert_ffn),
            shared_expert_ffn=narrower(spec.moe.shared_expert_ffn)
            if spec.moe.shared_expert_ffn
            else 0,
        )
    return width


def build_run_spec(
    plan_path: str | Path,
    *,
    steps: int = 3,
    backend: str = "gloo",
    proxy: bool = False,
    seed: int = 0,
    timeout_s: float = 60.0,
    checkpoint_dir: str | None = None,
    fault: str | None = None,
    world_size_available: int | None = None,
    verify: bool = False,
    checkpoint_every_steps: int | None = None,
) -> RunSpec:
    """Read the plan, resolve the model and settle every backend-dependent choice (with notes)."""
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, "one of " + ", ".join(BACKENDS))
    parse_fault(fault)
    plan = load_plan(plan_path)
    config = plan.config
    check_executable(config)
    if bug(fault):
        check_bug_applies(bug(fault), config)
    interval = plan.document["plan"].get("checkpoint_interval_s")
    _check_world_size(config, backend, world_size_available)
    notes: list[str] = []
    spec = _plan_model(plan.model_name, config, notes)
    if backend == "gloo":
        spec, config = _fit_host_memory(spec, config, plan.model_name, proxy, notes)
    spec = _untie_split_embeddings(spec, config, notes)
    dtype = _run_dtype(config.precision, backend, notes)
    offload = _run_offload(config.offload, backend, notes)
    notes += _sharding_notes(config)
    interval = _checkpoint_interval(interval, checkpoint_dir, checkpoint_every_steps, notes)
    run = RunSpec(
        config=config,
        model=spec,
        model_name=plan.model_name,
        steps=steps,
        seed=seed,
        backend=backend,
        dtype=dtype,
        timeout_s=timeout_s,
        checkpoint_dir=checkpoint_dir,
        offload=offload,
        fault=fault,
        notes=tuple(notes),
        verify=verify,
        checkpoint_interval_s=float(interval) if checkpoint_dir and interval else None,
        checkpoint_every_steps=checkpoint_every_steps if checkpoint_dir else None,
    )
    if checkpoint_dir:
        run = _with_resume_step(run, checkpoint_dir, world_size_available)
    return run


def _check_world_size(
    config: ParallelConfig, backend: str, world_size_available: int | None
) -> None:
    """The plan's ranks against the launch: torchrun's WORLD_SIZE, else what this machine runs."""
    if world_size_available is not None and config.world_size != world_size_available:
        # under torchrun the launch fixed the world size
        raise ConfigError(
            "WORLD_SIZE",
            world_size_available,
            f"{config.world_size}",
            message=(
                f"the plan needs {config.world_size} ranks (dp*tp*pp*cp) but torchrun started "
                f"WORLD_SIZE={world_size_available}; relaunch with --nnodes x --nproc-per-node = "
                f"{config.world_size}"
            ),
        )
    cap = world_size_available if world_size_available is not None else max_local_ranks(backend)
    if config.world_size > cap:
        where = (
            "GPUs on this machine" if backend == "nccl" else "local gloo processes on this machine"
        )
        raise ConfigError(
            "world_size",
            config.world_size,
            f"at most {cap} {where}; launch `planner run` under torchrun on a cluster "
            f"(docs/executor.md)",
        )


def _plan_model(model_name: str, config: ParallelConfig, notes: list[str]) -> TransformerSpec:
    """The plan's model at the plan's sequence, checked against what the executor builds."""
    spec = resolve_transformer(model_name, config.seq)
    if spec.position == "learned" and spec.max_positions and config.seq > spec.max_positions:
        raise ConfigError(
            "plan.seq", config.seq, f"at most the model's {spec.max_positions} learned positions"
        )
    spec = spec.with_(seq=config.seq)
    check_model_executable(config, spec)
    if spec.parallel_block or spec.embed_norm or spec.type_vocab or spec.norms_per_block != 2:
        notes.append(
            f"{spec.name} runs as the reference sequential pre-norm block (its parallel-residual / "
            f"extra-norm details are not modelled by planner.models.transformer)"
        )
    config.check_model(heads=spec.heads, kv_heads=spec.n_kv_heads, blocks=spec.total_blocks)
    return spec


def _fit_host_memory(
    spec: TransformerSpec, config: ParallelConfig, model_name: str, proxy: bool, notes: list[str]
) -> tuple[TransformerSpec, ParallelConfig]:
    """A CPU run that fits this machine: the plan's model, or its --proxy shrink."""
    needed, have = training_bytes_on_host(spec, config), host_memory_bytes()
    if needed > have // 2:
        if not proxy:
            raise ConfigError(
                "model",
                model_name,
                f"a model whose CPU run fits this machine (needs about {needed / 2**30:.1f} GiB "
                f"of {have / 2**30:.1f} GiB); pass --proxy to run a shrunk model with the "
                f"same parallel layout",
            )
        spec, config, note = proxy_spec(spec, config)
        notes.append(note)
    elif proxy:
        notes.append("--proxy: not needed, the plan's model fits this machine; ran it at full size")
    return spec, config


def _untie_split_embeddings(
    spec: TransformerSpec, config: ParallelConfig, notes: list[str]
) -> TransformerSpec:
    """Tied embeddings untied where tp or pp splits them across ranks."""
    if spec.tied_embeddings and (config.tp > 1 or config.pp > 1):
        notes.append(
            "embeddings untied (tok_embeddings and output are separate weights in the run and "
            "in the reference) because tp>1 or pp>1 splits them across ranks"
        )
        return spec.with_(tied_embeddings=False)
    return spec


def _run_dtype(precision: str, backend: str, notes: list[str]) -> str:
    """The precision the run uses: fp8's substitute, fp32 on CPU, else the plan's."""
    if precision == "fp8":
        notes.append(fp8_line(backend))
        return fp8_substitute(backend)
    if backend == "gloo" and precision != "fp32":
        notes.append(f"precision {precision} downgraded to fp32 (CPU/gloo executor)")
        return "fp32"
    return precision


def _run_offload(offload: str, backend: str, notes: list[str]) -> str:
    """The offload the run applies: none on CPU, where everything lives in host memory."""
    if backend == "gloo" and offload != "none":
        notes.append(
            f"offload {offload} not applied: on CPU everything already lives in host memory"
        )
        return "none"
    return offload


def _sharding_notes(config: ParallelConfig) -> list[str]:
    """How the executor's FSDP2 runs the plan's ZeRO stage, shard group and expert replicas."""
    notes, replicas = [], config.dp * config.cp
    if config.zero == 1 and replicas > 1:
        notes.append(
            "ZeRO-1 runs as FSDP2 without resharding after forward (gradients are sharded too: ZeRO-2)"
        )
    if config.zero and replicas == 1:
        notes.append(
            f"ZeRO-{config.zero} has no effect with dp=1" + (" and cp=1" if config.cp == 1 else "")
        )
    if 0 < config.dp_shard < config.dp:
        if config.zero == 0:
            notes.append(
                f"dp_shard {config.dp_shard} has no effect with zero 0 (nothing is sharded)"
            )
        else:
            notes.append(
                f"hybrid sharding (FSDP2 HSDP): ZeRO-{config.zero} states sharded over dp_shard x cp = "
                f"{config.dp_shard * config.cp} ranks, replicated over {config.dp // config.dp_shard} groups"
            )
    if config.ep > 1 and config.zero and replicas // config.ep > 1:
        notes.append(
            f"routed experts are replicated over their {replicas // config.ep} expert data-parallel ranks "
            f"(gradients all-reduced there), not ZeRO-sharded; dense parameters are"
        )
    return notes


def _checkpoint_interval(
    interval: float | None,
    checkpoint_dir: str | None,
    checkpoint_every_steps: int | None,
    notes: list[str],
) -> float | None:
    """The wall-time checkpoint interval the run keeps (None when --checkpoint-every-steps
    replaces the plan's)."""
    if checkpoint_every_steps and not checkpoint_dir:
        raise ConfigError(
            "--checkpoint-every-steps", checkpoint_every_steps, "only with --checkpoint-dir"
        )
    if checkpoint_dir and checkpoint_every_steps:
        notes.append(
            f"checkpoints every {checkpoint_every_steps} step(s) (--checkpoint-every-steps)"
            + (f"; the plan's checkpoint_interval_s {interval:g} s not used" if interval else "")
        )
        return None
    if checkpoint_dir and interval:
        notes.append(
            f"checkpoints every {interval:g} s of wall time (plan.checkpoint_interval_s) and after "
            "the last step"
        )
    return interval


def _with_resume_step(
    run: RunSpec, checkpoint_dir: str, world_size_available: int | None
) -> RunSpec:
    """The run resuming from the directory's latest complete checkpoint (none: from the start)."""
    # optional heavy dependency: planner.executor.checkpoint imports torch at its top
    from planner.executor.checkpoint import check_resumable

    # under torchrun every rank reads the directory; only rank 0 moves damaged steps aside
    set_aside = world_size_available is None or os.environ.get("RANK", "0") == "0"
    return dataclasses.replace(
        run, resume_step=check_resumable(checkpoint_dir, run, set_aside=set_aside)
    )
