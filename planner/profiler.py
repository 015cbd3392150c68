"""Analytic per-layer profile of a model: parameters, FLOPs and activation bytes per micro-batch.

`profile_model(source, seq=..., micro_batch=..., precision=...)` takes a catalog name, a config
path, a `package.module:factory` string, a TransformerSpec or a ModuleSpec and returns a
`ModelProfile`: one `LayerProfile` per pipeline-splittable unit (embedding, each block, head,
loss) with

- params: exact counts (cost_models.params; Narayanan et al. 2021 Sec. 5.1 for GPT); for MoE models
  also the active parameters per token (`params_active`, the input embedding included as Mistral and
  Qwen count; `params_active_without_input_embedding` as OpenAI and DeepSeek do) and the MTP
  modules' (`params_mtp`, apart from `params` as DeepSeek's 671B; their units follow the head);
- flops_per_token: training FLOPs per token at the profiled sequence length, 6 N_active + 3 x the
  attention cores' forward (+ MTP), the model FLOPs of cost_models.flops.model_flops_per_step;
- flops_fwd / flops_bwd: FlopCounterMode's convention (cost_models.flops; Narayanan et al. 2021);
  backward = 2x forward for GEMMs, 2.5x for a flash attention core;
- recompute_flops[mode]: forward FLOPs re-run in backward by recomputation;
- activation_bytes[mode]: bytes saved for backward, recompute none / selective / full, from the
  block tables of the framework's kernels (cost_models.activations over cost_models.blocks: the
  same numbers estimate reports; Korthikanti et al. 2022, Table 2, for fused kernels). The loss's
  saved log-softmax is reported in its own row and in `logits_peak`, not in the activation total:
  the memory model counts it with the logits transient on the last stage, as estimate does.

`ModelProfile.to_dict()` is the `planner profile --json` document of docs/cli-contract.md.
For a ModuleSpec the per-layer numbers are those measured on the meta device
(planner.module_profiler), re-measured at the requested micro-batch and sequence.
"""

from __future__ import annotations

from dataclasses import replace

from cost_models import activations as A
from cost_models import flops as F
from cost_models import params as P
from planner.errors import ConfigError
from planner.profile_records import RECOMPUTE_MODES, LayerProfile, ModelProfile
from planner.run_options import RunOptions
from planner.software import check_activation_fp8_input, software_for
from planner.spec import TransformerSpec
from planner.parallel import PRECISIONS, _choice
from planner.sources import resolve_model
from cost_models.activations import activation_precision


def describe_spec(spec: TransformerSpec) -> dict:
    """The `model` object of the JSON documents for a TransformerSpec (MoE, MLA and window fields
    only for the models that have them)."""
    from dataclasses import asdict

    out = {
        "name": spec.name,
        "model_type": spec.model_type,
        "params": P.total_params(spec),
        "layers": spec.layers,
        "encoder_layers": spec.encoder_layers,
        "hidden": spec.hidden,
        "heads": spec.heads,
        "kv_heads": spec.n_kv_heads,
        "head_dim": spec.d_head,
        "ffn": spec.d_ffn,
        "vocab": spec.vocab,
        "seq": spec.seq,
        "position": spec.position,
        "gated_mlp": spec.gated_mlp,
        "norm": spec.norm,
        "tied_embeddings": spec.tied_embeddings,
        "source": dict(spec.extras).get("source", spec.name),
    }
    if spec.moe is not None:
        out["moe"] = asdict(spec.moe)
    if spec.mla is not None:
        out["mla"] = asdict(spec.mla)
    if spec.sliding_window:
        out["sliding_window"] = spec.sliding_window
        out["window_layers"] = list(spec.window_layers) if spec.window_layers is not None else None
    if spec.mtp_modules:
        out["mtp_modules"] = spec.mtp_modules
    return out


def _block_profile(
    spec: TransformerSpec, b: int, s: int, *, flash: bool, act: dict
) -> LayerProfile:
    """One (decoder) block of uniform `spec` (a kind of TransformerSpec.block_kinds); its activation bytes are the
    run's software's (cost_models.activations.block_bytes_of, what estimate reads)."""
    sw = act["sw"]
    saved = dict(precision=act["precision"], zero=act["zero"], tp=act["tp"], sp=act["sp"])
    return LayerProfile(
        name="",
        kind="block",
        params=P.block_params(spec),
        flops_fwd=float(F.block_flops_fwd(spec, b, s)),
        flops_bwd=float(F.block_flops_bwd(spec, b, s, flash=flash)),
        activation_bytes={
            m: int(A.block_bytes_of(sw, spec, b, s, recompute=m, **saved)) for m in RECOMPUTE_MODES
        },
        recompute_flops={
            m: float(
                F.block_recompute_flops(
                    spec, b, s, m, flash=flash, selective=sw.framework.selective_recompute
                )
            )
            for m in RECOMPUTE_MODES
        },
    )


def _mtp_profile(
    spec: TransformerSpec,
    i: int,
    b: int,
    s: int,
    *,
    flash: bool,
    act: dict,
    tp: int,
    sp: bool,
    loss: str,
) -> LayerProfile:
    """Multi-token-prediction module `i` (DeepSeek-V3 report Sec. 2.2): a block of the last kind, its
    2h x h projection and the shared head's logits and loss; activations those of a block, a head and
    a loss (an estimate: the reference model builds no MTP module)."""
    block = _block_profile(spec.last_kind, b, s, flash=flash, act=act)
    extra = 2 * b * s * (2 * spec.hidden * spec.hidden + P.head_matmul_weights(spec))

    precision = activation_precision(act["sw"], act["precision"], act["zero"])
    head = A.head_bytes(
        spec, b, s, precision=precision, kernels=act["sw"].framework.kernels, tp=tp, sp=sp
    ) + A.loss_bytes(spec, b, s, tp=tp, loss=loss, precision=precision)
    return LayerProfile(
        name=f"mtp.{i}",
        kind="mtp",
        params=P.mtp_module_params(spec),
        flops_fwd=block.flops_fwd + extra,
        flops_bwd=block.flops_bwd + 2 * extra,
        activation_bytes={m: int(v + head) for m, v in block.activation_bytes.items()},
        recompute_flops=block.recompute_flops,
    )


def profile_spec(
    spec: TransformerSpec,
    *,
    seq: int | None = None,
    micro_batch: int = 1,
    precision: str = "amp-bf16",
    framework: str = "megatron",
    tp: int = 1,
    sp: bool = False,
    zero: int = 0,
    selective: str | None = None,
    options: RunOptions | None = None,
) -> ModelProfile:
    """Analytic profile of a TransformerSpec (all formulas in cost_models; activation bytes from the
    framework's block tables, the same the cost model reads). Each block is profiled as its kind
    (TransformerSpec.block_kinds: an MoE model's leading dense blocks, windowed blocks); MTP modules
    follow the head as units of kind 'mtp'. Activation bytes are per rank of a tensor-parallel group of `tp`
    (with sequence parallelism `sp`), for the run `options` estimate takes too (the attention kernel, dropout,
    the cross-entropy kernel, Megatron-Core's recompute_modules (selective column) and activation_fp8_input,
    an eager stack's fused_norm; planner.software.software_for checks each); `selective` overrides the
    framework's selective policy ('attention' or 'op')."""
    s = spec.seq if seq is None else seq
    b = micro_batch
    _check_profile_run(b, s, tp=tp, sp=sp, zero=zero)
    sw = _run_software(spec, framework, options or RunOptions(), selective)
    flash = sw.kernel(precision, spec) != "math"
    # FSDP's mixed precision (ZeRO >= 2) runs eager modules on 16-bit weights: the same table the
    # cost model uses (block_bytes_of reads it through cost_models.activations.block_table_of
    # with `zero`)
    act = dict(sw=sw, precision=precision, zero=zero, tp=tp, sp=sp)
    layers = [_embedding_profile(spec, b, s, act=act)]
    layers += _encoder_profiles(spec, b, s, flash=flash, act=act)
    layers += _decoder_profiles(spec, b, s, flash=flash, act=act)
    layers += [_head_profile(spec, b, s, act=act), _loss_profile(spec, b, s, act=act)]
    layers += [
        _mtp_profile(spec, i, b, s, flash=flash, act=act, tp=tp, sp=sp, loss=sw.loss)
        for i in range(spec.mtp_modules)
    ]
    return ModelProfile(
        model=describe_spec(spec),
        seq=s,
        micro_batch=b,
        precision=precision,
        flash=flash,
        framework=sw.framework.name,
        params=P.total_params(spec),
        layers=tuple(layers),
        method="analytic",
        extra=_profile_extra(spec, b, s, act=act),
    )


def _check_profile_run(b, s, *, tp, sp, zero) -> None:
    """Micro-batch, sequence, tp, ZeRO stage and sequence parallelism of a profile, or a
    ConfigError."""
    if not isinstance(b, int) or b < 1:
        raise ConfigError("micro_batch", b, "a positive integer")
    if not isinstance(s, int) or s < 1:
        raise ConfigError("seq", s, "a positive integer")
    for name, degree in (("tp", tp), ("zero", zero)):
        if (
            isinstance(degree, bool)
            or not isinstance(degree, int)
            or not (1 if name == "tp" else 0) <= degree
            or (name == "zero" and degree > 3)
        ):
            raise ConfigError(
                name, degree, "a positive integer" if name == "tp" else "0, 1, 2 or 3"
            )
    if not isinstance(sp, bool) or (sp and tp == 1):
        raise ConfigError(
            "sequence_parallel", sp, "false with tp 1 (sequence parallelism shards over tp)"
        )


def _run_software(spec: TransformerSpec, framework: str, options: RunOptions, selective):
    """The framework's software for the run options, checked against the model, with `selective`
    overriding its selective-recompute policy."""
    sw = software_for(framework, options)
    check_activation_fp8_input(sw, spec)
    if selective is not None and selective != sw.framework.selective_recompute:
        sw = replace(sw, framework=replace(sw.framework, selective_recompute=selective))
    return sw


def _unit_profile(name: str, kind: str, params: int, saved_bytes, flops_fwd: float = 0.0):
    """A unit with the same activation bytes under every recompute mode and nothing recomputed
    (embedding, head, loss)."""
    return LayerProfile(
        name=name,
        kind=kind,
        params=params,
        flops_fwd=float(flops_fwd),
        flops_bwd=float(2 * flops_fwd),
        activation_bytes={m: int(saved_bytes) for m in RECOMPUTE_MODES},
        recompute_flops={m: 0.0 for m in RECOMPUTE_MODES},
    )


def _embedding_profile(spec: TransformerSpec, b: int, s: int, *, act: dict) -> LayerProfile:
    """The input embedding: its table and the bytes its (dropout) output saves."""
    saved = A.embedding_bytes(
        spec,
        b,
        s,
        precision=act["precision"],
        dropout=act["sw"].dropout,
        tp=act["tp"],
        sp=act["sp"],
    )
    return _unit_profile("embedding", "embedding", P.embedding_params(spec), saved)


def _encoder_profiles(
    spec: TransformerSpec, b: int, s: int, *, flash: bool, act: dict
) -> list[LayerProfile]:
    """The encoder blocks of an encoder-decoder model (none for a decoder-only one)."""
    if not spec.encoder_layers:
        return []
    sw, enc = act["sw"], spec.with_(encoder_layers=0)
    saved = dict(precision=act["precision"], zero=act["zero"], tp=act["tp"], sp=act["sp"])
    core = 4 * b * s * s * spec.attn_width
    unit = dict(
        kind="encoder_block",
        params=P.encoder_block_params(spec),
        flops_fwd=float(F.encoder_block_flops_fwd(spec, b, s)),
        flops_bwd=float(
            2 * F.encoder_block_matmul_flops_fwd(spec, b, s) + core * (2.5 if flash else 2.0)
        ),
        activation_bytes={
            m: int(A.block_bytes_of(sw, enc, b, s, recompute=m, **saved)) for m in RECOMPUTE_MODES
        },
        recompute_flops={
            m: float(
                F.block_recompute_flops(
                    enc, b, s, m, flash=flash, selective=sw.framework.selective_recompute
                )
            )
            for m in RECOMPUTE_MODES
        },
    )
    return [LayerProfile(name=f"encoder.layers.{i}", **unit) for i in range(spec.encoder_layers)]


def _decoder_profiles(
    spec: TransformerSpec, b: int, s: int, *, flash: bool, act: dict
) -> list[LayerProfile]:
    """Each decoder block, profiled as its kind (TransformerSpec.block_kinds)."""
    kind_of = {}
    for kind in spec.block_kinds:
        unit = _block_profile(kind.spec, b, s, flash=flash, act=act)
        kind_of.update({i: unit for i in kind.layers})
    return [replace(kind_of[i], name=f"layers.{i}") for i in range(spec.layers)]


def _head_profile(spec: TransformerSpec, b: int, s: int, *, act: dict) -> LayerProfile:
    """Final norm and output projection."""
    saved = A.head_bytes(
        spec,
        b,
        s,
        precision=act["precision"],
        kernels=act["sw"].framework.kernels,
        tp=act["tp"],
        sp=act["sp"],
    )
    params = P.final_norm_params(spec) + P.head_params(spec)
    return _unit_profile("head", "head", params, saved, F.head_flops_fwd(spec, b, s))


def _loss_profile(spec: TransformerSpec, b: int, s: int, *, act: dict) -> LayerProfile:
    """The cross-entropy loss (its saved bytes; no parameters, no FLOPs counted)."""
    saved = A.loss_bytes(spec, b, s, tp=act["tp"], loss=act["sw"].loss, precision=act["precision"])
    return _unit_profile("loss", "loss", 0, saved)


def _profile_extra(spec: TransformerSpec, b: int, s: int, *, act: dict) -> dict:
    """The profile's whole-model numbers (logits peak, model FLOPs, parameter counts) and the run
    its activation bytes are for."""
    sw, tp = act["sw"], act["tp"]
    kernels = sw.framework.kernels
    logits_peak = A.logits_peak_bytes(
        spec, b, s, precision=act["precision"], kernels=kernels, tp=tp, loss=sw.loss
    )
    return {
        "activations": {"logits_peak": int(logits_peak)},
        "model_flops": float(F.model_flops_per_step(spec, b * s, seq=s)),
        "matmul_params": P.matmul_params(spec),
        "params_active": P.active_params(spec),
        "params_active_without_input_embedding": P.active_params(spec, input_embedding=False),
        "params_mtp": P.mtp_params(spec),
        "flops_per_token": float(F.flops_per_token(spec, s)),
        # the run the activation bytes are for: per rank of a tp group, and the software options
        # they follow
        "tp": tp,
        "sequence_parallel": act["sp"],
        "zero": act["zero"],
        "software": {
            "kernels": kernels,
            "loss": sw.loss,
            "selective": sw.framework.selective_recompute,
            **({"recompute_modules": list(sw.recompute_modules)} if sw.recompute_modules else {}),
            **({"activation_fp8_input": True} if sw.activation_fp8_input else {}),
            **({"fused_norm": True} if sw.fused_norm else {}),
        },
    }


def profile_model(
    source,
    *,
    seq: int | None = None,
    micro_batch: int = 1,
    precision: str = "amp-bf16",
    framework: str = "megatron",
    zero: int = 0,
    tp: int = 1,
    sp: bool = False,
    options: RunOptions | None = None,
) -> ModelProfile:
    """Profile a model given as a name/path/factory string, a TransformerSpec or a ModuleSpec. The run
    options (tensor parallelism `tp` with `sp`, and `options`: the cross-entropy kernel, recompute_modules,
    activation_fp8_input, ...) are profile_spec's; a module factory is measured as it runs on one device, so
    it takes none of them but the attention kernel (flash unless 'unfused')."""
    _choice("precision", precision, PRECISIONS)
    options = options or RunOptions()
    if isinstance(source, str):
        source = resolve_model(source, seq=seq)
    if isinstance(source, TransformerSpec):  # analytic: no torch import
        return profile_spec(
            source,
            seq=seq,
            micro_batch=micro_batch,
            precision=precision,
            framework=framework,
            zero=zero,
            tp=tp,
            sp=sp,
            options=options,
        )
    _check_module_run(tp, sp, options)
    flash = (options.attention or "flash") != "unfused"
    return _profile_module_spec(source, seq, micro_batch, precision, flash)


def _check_module_run(tp: int, sp: bool, options: RunOptions) -> None:
    """A module factory takes no run option but the attention kernel (and dropout): a ConfigError
    names the first one given."""
    given = dict(tp=tp, sp=sp, **options.without("attention").without("dropout").chosen())
    defaults = dict(tp=1, sp=False)
    for name, value in given.items():
        if value != defaults.get(name):
            raise ConfigError(
                name,
                value,
                f"{defaults.get(name)} for a module factory, which is measured on one "
                "device with its own modules (a catalog name or config.json takes "
                "run options)",
            )


def _profile_module_spec(
    source, seq, micro_batch: int, precision: str, flash: bool
) -> ModelProfile:
    """A ModuleSpec's profile: the one it carries when measured as asked, else measured again."""
    # optional heavy dependency: planner.module_profiler imports torch at its top
    from planner.module_profiler import ModuleSpec, profile_module

    if isinstance(source, ModuleSpec):
        if (
            (source.micro_batch, source.seq, source.precision)
            == (micro_batch, seq or source.seq, precision)
            and source.profile is not None
            and source.profile.flash == flash
        ):
            return source.profile
        return profile_module(
            source.factory,
            seq=seq or source.seq,
            micro_batch=micro_batch,
            precision=precision,
            flash=flash,
        ).profile
    raise TypeError(f"cannot profile a {type(source).__name__}")
