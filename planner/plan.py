"""The plan document: a versioned JSON file (planner/schemas/plan.schema.json) and its typed reader.

`load_plan(path) -> Plan` validates the file against the published schema, rejects any
`schema_version` other than the one this build writes, and builds the `ParallelConfig` inside
(which validates the degrees once more, by field). `Plan.device_mesh()` turns the plan into a torch
`DeviceMesh` for a training script launched with torchrun.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cost_models.params import total_params
from planner.catalog import CATALOG, get as catalog_get
from planner.errors import ConfigError
from planner.option_rules import check_options
from planner.parallel import MeshAxis, ParallelConfig
from planner.run_options import RunOptions, grad_reduce_dtype_of
from planner.spec import TransformerSpec, record_of
from frameworks import load_framework
from planner.io import MAX_JSON_DEPTH, depth_exceeds, numbers, read_json
from cost_models.step import Software
from hardware_profiles import load_profile
from planner.software import BLOCK_SCALED_RECIPES, check_fp8_scaling_hardware

SCHEMA_VERSION = "1"
"""The plan-document version this build writes and reads."""

_AXIS_BY_LETTER = {"D": MeshAxis.DP, "P": MeshAxis.PP, "T": MeshAxis.TP, "C": MeshAxis.CP}
"""Placement letters that are axes of the world (world = dp x pp x tp x cp). E is not one: expert-parallel
groups regroup a pipeline stage's ranks (Megatron-Core's expert rank generator), so it adds no mesh dim."""
_CONFIG_FIELDS = frozenset(f.name for f in fields(ParallelConfig))
_DERIVED_PLAN_KEYS = frozenset({"num_microbatches", "world_size"})
MAX_NUMBER = 1e30
"""Largest magnitude of any number in a plan document. Above what the cost model gives for the sizes
the CLI accepts (a 1T-parameter model, 2**24 sequences of 2**24 tokens on one CPU: about 1e20 s per
step) and far below float overflow for what commands derive from it (x steps x dollars x 1e9)."""


@cache
def plan_schema() -> dict:
    """The published JSON Schema of a plan document (planner/schemas/plan.schema.json)."""
    text = resources.files("planner").joinpath("schemas/plan.schema.json").read_text()
    return json.loads(text)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryPrediction:
    """Predicted per-GPU memory at the allocator's peak (torch.cuda.max_memory_allocated semantics)."""

    peak_bytes_per_gpu: int
    """Largest peak over all ranks, bytes."""
    capacity_bytes: int
    """Usable device memory of the profile, bytes."""
    fits: bool
    """peak_bytes_per_gpu <= capacity_bytes."""
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    other_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """What the cost model predicts for one step of the plan."""

    step_time_s: float
    """Seconds per optimizer step."""
    samples_per_s: float
    """Sequences per second over the whole job."""
    tokens_per_s: float
    """Tokens per second over the whole job."""
    tflops_per_gpu: float
    """Model TFLOP/s per GPU (recompute not counted)."""
    mfu: float
    """tflops_per_gpu / dense peak of the precision used."""
    memory: MemoryPrediction
    time_breakdown_s: Mapping[str, float]
    """Seconds per step by term: compute, tp_comm, dp_comm, pp_p2p, bubble, ..."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A validated plan document. `document` keeps the file's full content (extra keys included)."""

    schema_version: str
    model_name: str
    """Catalog name, config path or factory the plan was made for."""
    hardware_name: str
    """Hardware profile name (or path)."""
    gpus: int
    """World size."""
    nodes: int
    config: ParallelConfig
    """The parallel configuration; its degrees multiply to `gpus`."""
    prediction: Prediction
    alternatives: tuple[Mapping[str, Any], ...] = ()
    """Key numbers of the search's runners-up (recommend), best first; empty for `estimate`."""
    document: Mapping[str, Any] = field(default_factory=dict)
    """The whole document as read."""

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def mesh_shape(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(mesh_dim_names, mesh_shape) ordered by the placement string, outermost first."""
        return mesh_dims(self.config)

    def rank_layout(self) -> np.ndarray:
        """Global ranks arranged as the device mesh (see `rank_layout`)."""
        return rank_layout(self.config)

    def device_mesh(self, device_type: str | None = None):
        """Build the torch DeviceMesh of this plan; call it under torchrun (or after init_process_group).

        The mesh dimensions follow the placement string from outermost to innermost, named by
        `planner.parallel.MeshAxis` ("dp", "pp", "tp"); the right-most letter of the placement gets
        adjacent ranks, so with the usual "DPT" a tensor-parallel group sits inside one node.

        Worked example (dp=2, pp=2, tp=2, 8 ranks, as Megatron's `initialize_model_parallel`
        docstring lays out its groups):
        placement "DPT" -> mesh_dim_names ("dp", "pp", "tp"), mesh_shape (2, 2, 2)::
            ranks = [[[0, 1], [2, 3]],      # dp index 0: pp stage 0 -> tp ranks 0,1; stage 1 -> 2,3
                     [[4, 5], [6, 7]]]      # dp index 1: pp stage 0 -> tp ranks 4,5; stage 1 -> 6,7
            tp groups: [0,1] [2,3] [4,5] [6,7]       (innermost: adjacent ranks, NVLink)
            pp groups: [0,2] [1,3] [4,6] [5,7]       (stage 0 -> stage 1 peers)
            dp groups: [0,4] [1,5] [2,6] [3,7]       (gradient all-reduce / ZeRO shards)

        placement "TDP" -> mesh_dim_names ("tp", "dp", "pp"): pp groups [0,1] [2,3] ..., tp groups
        [0,4] [1,5] ... (tensor parallelism across the outer, slower links).

        In a script: ``mesh = planner.load_plan("plan.json").device_mesh()`` then
        ``mesh["tp"]`` for `parallelize_module`, ``mesh["dp"]`` for `fully_shard`, ``mesh["pp"]``
        for `PipelineStage(group=mesh["pp"].get_group())`; a dimension of size 1 is still present.
        """
        import torch
        from torch.distributed.device_mesh import init_device_mesh

        if device_type is None:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
        names, shape = self.mesh_shape()
        return init_device_mesh(device_type, shape, mesh_dim_names=names)

    def to_document(self) -> dict:
        """The document as a plain dict (what `load_plan` read, or an equivalent one)."""
        return json.loads(json.dumps(self.document))


def mesh_dims(config: ParallelConfig) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(names, sizes) of the mesh dimensions ordered by `config.placement`, outermost first (a cp
    dimension only where the placement has C; E adds none, see _AXIS_BY_LETTER)."""
    degree = {
        MeshAxis.DP: config.dp,
        MeshAxis.PP: config.pp,
        MeshAxis.TP: config.tp,
        MeshAxis.CP: config.cp,
    }
    axes = [_AXIS_BY_LETTER[letter] for letter in config.placement if letter in _AXIS_BY_LETTER]
    return tuple(a.value for a in axes), tuple(degree[a] for a in axes)


def rank_layout(config: ParallelConfig) -> np.ndarray:
    """Global ranks in row-major order over the placement-ordered mesh (what init_device_mesh does).

    >>> from planner.parallel import ParallelConfig
    >>> rank_layout(ParallelConfig(dp=2, pp=2, tp=2, global_batch=2, placement="DPT")).tolist()
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    """
    _, shape = mesh_dims(config)
    return np.arange(config.world_size).reshape(shape)


def rank_coordinates(config: ParallelConfig, rank: int) -> dict[str, int]:
    """The (dp, pp, tp) indices of a global rank under the plan's placement."""
    names, shape = mesh_dims(config)
    return dict(zip(names, (int(i) for i in np.unravel_index(rank, shape))))


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan document; any problem is a ConfigError naming the field (exit 2)."""
    return plan_from_document(read_json(path, "plan"), source=str(path))


def _check_numbers(document: Mapping[str, Any], source: str) -> None:
    """Every number finite and at most MAX_NUMBER in magnitude: a NaN, an infinity or 1e308 (a
    corrupted or hand-edited file) is refused here, the same way for every command that reads plans."""
    if depth_exceeds(document, MAX_JSON_DEPTH):
        raise ConfigError(
            "plan",
            source,
            "a plan document",
            message=f"{source}: nested deeper than {MAX_JSON_DEPTH} levels; not a plan document",
        )
    for where, value in numbers(document):
        if not math.isfinite(value) or abs(value) > MAX_NUMBER:
            raise ConfigError(
                where,
                value,
                f"a finite number of magnitude at most {MAX_NUMBER:g}",
                message=f"{where}={value!r} is invalid: allowed a finite number of "
                f"magnitude at most {MAX_NUMBER:g}",
            )


def _check_positions(model: Mapping[str, Any], seq: int) -> None:
    """plan.seq within the model's learned position table (the rule of planner.sources.with_seq), from
    the document's model.arch, or from the catalog for a plan without it."""
    arch = model.get("arch")
    if isinstance(arch, Mapping):
        position, rows = arch.get("position"), arch.get("max_positions")
    else:
        if model.get("name") not in CATALOG:
            return
        spec = catalog_get(model["name"])
        position, rows = spec.position, spec.max_positions or spec.seq
    if position == "learned" and isinstance(rows, int) and rows > 0 and seq > rows:
        raise ConfigError(
            "plan.seq", seq, f"at most {rows} (rows of {model['name']}'s learned position table)"
        )


DESCRIPTION_FIELDS = {
    "layers": "layers",
    "hidden": "hidden",
    "heads": "heads",
    "kv_heads": "n_kv_heads",
    "ffn": "d_ffn",
    "vocab": "vocab",
}
"""A plan document's model description (what estimate writes beside `model.arch`) and the
TransformerSpec property each must equal."""
REMAKE = (
    "the plan was edited or made for another model: re-run `planner recommend --out` or "
    "`planner estimate --json`"
)


def check_against_model(model: Mapping[str, Any], config: ParallelConfig) -> None:
    """The one check of a plan document's model against its plan, for every command that reads
    plans (explain, export, report, run): the description (layers, hidden, heads, ...) and the
    parameter count still match the model's shape (`model.arch`, else the catalog entry of its
    name), and the degrees are ones that model takes (ParallelConfig.check_against: tp divides the
    heads, ep needs experts, ...)."""
    spec = _model_shape(model)
    if spec is None:
        return
    for key, attribute in DESCRIPTION_FIELDS.items():
        shape = getattr(spec, attribute)
        if key in model and model[key] != shape:
            raise ConfigError(
                f"model.{key}",
                model[key],
                f"{shape}, the model's shape",
                message=(
                    f"model.{key}={model[key]!r} does not match the model it describes "
                    f"({_shape_source(model)}: {shape}); {REMAKE}"
                ),
            )
    if isinstance(model.get("arch"), Mapping):
        counted = total_params(spec)
        if model.get("params") != counted:
            raise ConfigError(
                "model.params",
                model.get("params"),
                f"{counted:,}",
                message=(
                    f"model.params={model.get('params')!r} does not match the parameter count of "
                    f"model.arch ({counted:,}); {REMAKE}"
                ),
            )
    config.check_against(spec, config.seq)


def _model_shape(model: Mapping[str, Any]) -> TransformerSpec | None:
    """The TransformerSpec a plan's model block describes: `model.arch` (every shape field, written
    by estimate), else the catalog entry of its name, else None (a factory's plan without arch)."""
    arch = model.get("arch")
    if isinstance(arch, Mapping):
        named = {"name": str(model.get("name", "model")), **arch}
        return record_of(TransformerSpec, named, "model.arch")
    if model.get("name") in CATALOG:
        return catalog_get(model["name"])
    return None


def _shape_source(model: Mapping[str, Any]) -> str:
    if isinstance(model.get("arch"), Mapping):
        return "model.arch"
    return f"catalog {model.get('name')}"


def check_physics(prediction: Mapping[str, Any]) -> None:
    """Predictions no machine can reach are refused (a hand-edited plan): MFU outside 0..100%, a
    step time that is not positive, a negative time, size or rate. (Throughput against step time
    is not checked: tests and examples edit the plan block of a document and keep its
    prediction.)"""
    mfu = prediction["mfu"]
    if not 0 <= mfu <= 1:
        raise ConfigError(
            "prediction.mfu",
            mfu,
            "0..1",
            message=(
                f"prediction.mfu={mfu!r} is impossible: allowed 0..1 (model FLOPs utilization above "
                f"100% of the device's peak FLOP/s); the plan was edited by hand"
            ),
        )
    step = prediction["step_time_s"]
    if step <= 0:
        raise ConfigError("prediction.step_time_s", step, "a positive number of seconds")
    parts = [
        ("time_breakdown_s", name, value) for name, value in prediction["time_breakdown_s"].items()
    ]
    parts += [
        ("memory", f.name, prediction["memory"][f.name])  # not margin_bytes: < 0 when
        for f in fields(MemoryPrediction)
        if f.name != "fits"
    ]  # the plan does not fit
    parts.append(("tflops_per_gpu", "", prediction["tflops_per_gpu"]))
    for key, name, value in parts:
        if value < 0:
            raise ConfigError(
                ".".join(filter(None, ("prediction", key, name))), value, "a number >= 0"
            )


def plan_from_document(document: Any, *, source: str = "plan") -> Plan:
    """Validate an in-memory plan document (schema, version, degrees) and type it."""
    if not isinstance(document, dict):
        raise ConfigError(
            "plan", source, "a JSON object with schema_version, model, hardware, plan, prediction"
        )
    if (
        "plan" not in document
        and isinstance(document.get("best"), dict)
        and "plan" in document["best"]
    ):
        document = document["best"]  # a `recommend --json` document: its winner is the plan
    _check_numbers(document, source)
    _check_schema(document)
    config = _plan_config(document)
    model, hardware = document["model"], document["hardware"]
    _check_positions(model, config.seq)
    check_against_model(model, config)
    check_physics(document["prediction"])
    check_options(
        precision=config.precision,
        fp8_scaling=run_options(document).fp8_scaling,
        framework=config.framework,
    )
    _check_recipe_hardware(document, config)
    return Plan(
        schema_version=document["schema_version"],
        model_name=model["name"],
        hardware_name=hardware["name"],
        gpus=hardware["gpus"],
        nodes=hardware["nodes"],
        config=config,
        prediction=_prediction(document["prediction"]),
        alternatives=tuple(document.get("alternatives", ())),
        document=document,
    )


def _check_schema(document: dict) -> None:
    """The schema version this build reads, and the document valid against
    planner/schemas/plan.schema.json (the best-matching error named)."""
    import jsonschema

    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(
            "schema_version",
            version,
            f"{SCHEMA_VERSION!r} (this build reads plan documents of schema version {SCHEMA_VERSION})",
        )
    validator = jsonschema.Draft202012Validator(plan_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "document"
        value = (
            error.instance
            if not isinstance(error.instance, (dict, list))
            else type(error.instance).__name__
        )
        raise ConfigError(
            where, value, f"{error.message} (schema planner/schemas/plan.schema.json)"
        )


def _plan_config(document: dict) -> ParallelConfig:
    """The plan's ParallelConfig, checked against its micro-batch count, the hardware's GPUs and
    the model's blocks (stages, recompute_layers)."""
    plan_part = document["plan"]
    config = ParallelConfig(
        **{
            k: (tuple(v) if k == "stages" else v)
            for k, v in plan_part.items()
            if k in _CONFIG_FIELDS
        }
    )
    if plan_part["num_microbatches"] != config.num_microbatches:
        raise ConfigError(
            "plan.num_microbatches",
            plan_part["num_microbatches"],
            f"global_batch/(dp*micro_batch) = {config.num_microbatches}",
        )
    config.check_world_size(document["hardware"]["gpus"])
    model = document["model"]
    if "layers" in model and config.stages:
        blocks = model["layers"] + model.get("encoder_layers", 0)
        if sum(config.stages) != blocks:
            raise ConfigError(
                "plan.stages", list(config.stages), f"blocks per stage summing to layers({blocks})"
            )
    if "layers" in model:
        config.check_recompute_layers(
            model["layers"] + model.get("encoder_layers", 0), "plan.recompute_layers"
        )
    return config


def _prediction(pred: dict) -> Prediction:
    """The document's prediction block, typed."""
    mem = pred["memory"]
    return Prediction(
        step_time_s=float(pred["step_time_s"]),
        samples_per_s=float(pred["samples_per_s"]),
        tokens_per_s=float(pred["tokens_per_s"]),
        tflops_per_gpu=float(pred["tflops_per_gpu"]),
        mfu=float(pred["mfu"]),
        memory=MemoryPrediction(**{f.name: mem[f.name] for f in fields(MemoryPrediction)}),
        time_breakdown_s={k: float(v) for k, v in pred["time_breakdown_s"].items()},
    )


_THE_STACKS_OWN = (
    "attention",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "overlap_p2p",
    "expandable_segments",
)
"""Options a plan records as what its stack did rather than as the run's choice: another stack
applies its own (planner.exports.retarget); explain's fresh search on the same stack adds them
(planner.explain._software_options)."""


def _check_recipe_hardware(document: Mapping[str, Any], config: ParallelConfig) -> None:
    """A plan file whose FP8 recipe its hardware cannot run (MXFP8 or NVFP4 without block-scaled
    tensor cores) is refused as estimate refuses it (planner.software.check_fp8_scaling_hardware);
    hardware this build cannot load is left to the commands that cost the plan."""
    if fp8_scaling_of(document) not in BLOCK_SCALED_RECIPES:
        return
    try:
        hw = load_profile(document["hardware"]["name"])
    except ConfigError:
        return
    software = Software.of(load_framework(config.framework), run_options(document))
    check_fp8_scaling_hardware(software, hw, config.precision)


def fp8_scaling_of(document: Mapping[str, Any]) -> str | None:
    """The FP8 recipe a plan document was costed with: its software block's, else its framework's
    default (a document without one); None for a plan without FP8."""
    plan, sw = document.get("plan") or {}, document.get("software") or {}
    if plan.get("precision") != "fp8":
        return None
    if sw.get("fp8_scaling"):
        return sw["fp8_scaling"]
    framework = sw.get("framework") or plan.get("framework")
    return Software.of(load_framework(framework)).fp8_scaling if framework else Software.fp8_scaling


_COUNTS = ("train_metrics", "activation_offload_layers")
"""Run options that are whole numbers (RunOptions refuses 2.0 as a count)."""


def run_options(document: Mapping[str, Any]) -> RunOptions:
    """The run's own choices in a plan document's `software` block (planner.estimate.
    software_block), as a RunOptions record: every option whose recorded value differs from the
    default its framework applies (cost_models.step.Software.of), except the stack's own
    (_THE_STACKS_OWN) and what the model's config decided (`from_config`: derived again); the
    gradient dtype from the bytes recorded. A target stack that lacks one drops it by name
    (planner.exports.retarget)."""
    sw = document.get("software") or {}
    plan = document.get("plan") or {}
    framework = sw.get("framework") or plan.get("framework")
    stack = load_framework(framework) if framework else None
    defaults = _defaults(stack, sw.get("fp8_scaling"))
    skipped = {*_THE_STACKS_OWN, *(sw.get("from_config") or ())}
    out = {}
    for option in fields(RunOptions):
        value = sw.get(option.name)
        if option.name in skipped or value is None:
            continue
        value = tuple(value) if isinstance(value, list) else value
        if option.name in _COUNTS and isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON Schema's integer admits 2.0; the record takes 2
        default = getattr(stack if option.name == "kernels" else defaults, option.name, None)
        if option.name == "fp8_scaling" and stack is not None:
            default = stack.fp8_scaling  # the stack's recipe, not the recorded one
        if value != default:
            out[option.name] = value
    dtype = _grad_reduce_dtype(sw, stack, plan.get("precision"))
    if dtype is not None:
        out["grad_reduce_dtype"] = dtype
    return RunOptions(**out)


def _defaults(stack, recipe: str | None) -> Software | None:
    """The options `stack` applies where a run leaves them unset, under the document's FP8 recipe
    (some depend on it: fp8_param_gather is off under nvfp4, cost_models.step.Software.of)."""
    if stack is None:
        return None
    return Software.of(stack, RunOptions(fp8_scaling=recipe))


def _grad_reduce_dtype(sw: Mapping[str, Any], stack, precision) -> str | None:
    """The gradient dtype a plan chose over its framework's default for its precision (the
    document's grad_reduce_bytes: 2 bf16, 4 fp32); None where it is the default or unknown
    (BF16_Optimizer sets its own)."""
    reduce = sw.get("grad_reduce_bytes")
    if stack is None or sw.get("bf16_optimizer") or grad_reduce_dtype_of(reduce) is None:
        return None
    default = stack.state_bytes.get(precision)
    if default is None or reduce == default.reduce:
        return None
    return grad_reduce_dtype_of(reduce)
