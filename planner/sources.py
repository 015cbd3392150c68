"""Turn the MODEL argument of every command into a model description.

`resolve_model(arg, seq=None)` accepts, in this order:
  1. a catalog name (planner.catalog) -> TransformerSpec;
  2. a path to a Hugging Face config.json (an existing file, or any argument ending in .json)
     -> TransformerSpec (planner.hf_config);
  3. 'package.module:factory', a callable returning an nn.Module -> ModuleSpec measured on the
     meta device at micro-batch 1 (planner.module_profiler).
Anything else is a ConfigError naming MODEL and the three accepted forms (exit 2).
`seq` overrides the model's default sequence length (checked against a learned position table).
"""

from __future__ import annotations

from pathlib import Path

from planner.catalog import CATALOG, get as catalog_get, names as catalog_names
from planner.errors import ConfigError
from planner.spec import TransformerSpec, with_seq
from planner.hf_config import read_hf_config
from cost_models.params import total_params

SPEC_PARAMS_TOLERANCE = 0.02
"""How far a module's measured parameters may be from those of the transformer it describes."""

_ALLOWED = (
    "a catalog name (list: "
    + ", ".join(catalog_names())
    + "), a config.json path or package.module:factory"
)


def transformer_spec(model) -> TransformerSpec:
    """The TransformerSpec the cost models score (planner.score): the model itself, or the
    transformer a `package.module:factory` module describes (ModuleSpec.spec: its `.spec`, or its
    Hugging Face-style `.config`), checked against the parameters measured on the meta device, so a
    description that does not match the module is refused rather than planned for."""
    if isinstance(model, TransformerSpec):
        return model
    name = getattr(model, "name", type(model).__name__)
    spec = getattr(model, "spec", None)
    if not isinstance(spec, TransformerSpec):
        raise ConfigError(
            "MODEL",
            name,
            "a transformer the cost model can score: a catalog name, a config.json, or "
            "a factory whose module exposes a TransformerSpec as `.spec` or a Hugging Face-style "
            "`.config`; this module can be profiled (planner profile) but not scored",
        )

    described, measured = int(total_params(spec)), int(model.params)
    if abs(measured - described) > SPEC_PARAMS_TOLERANCE * described:
        raise ConfigError(
            "MODEL",
            name,
            f"a module whose parameters match the transformer it describes: it holds "
            f"{measured:,}, its description {described:,} (more than "
            f"{SPEC_PARAMS_TOLERANCE:.0%} apart)",
        )
    return spec.with_(seq=model.seq, name=name)


def resolve_model(arg: str, *, seq: int | None = None):
    """Catalog name, config.json path or package.module:factory -> TransformerSpec | ModuleSpec."""
    if not isinstance(arg, str) or not arg:
        raise ConfigError("MODEL", arg, _ALLOWED)
    if arg in CATALOG:
        return with_seq(catalog_get(arg), seq)
    path = Path(arg)
    if arg.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ConfigError(
                "MODEL", arg, "an existing config.json file", message=f"MODEL={arg!r}: no such file"
            )
        return read_hf_config(path, seq=seq)
    if ":" in arg and not path.exists():
        # optional heavy dependency: planner.module_profiler imports torch at its top
        from planner.module_profiler import profile_module

        return profile_module(arg, seq=seq, micro_batch=1)
    raise ConfigError("MODEL", arg, _ALLOWED)


def default_framework(arg: str, framework: str | None) -> str:
    """The software stack a command costs when --framework is not given: `fsdp` (plain PyTorch DDP/FSDP running
    the modules as written) for a Hugging Face config.json or a package.module:factory, whose modules are the
    user's own or Hugging Face's; `megatron` for a catalog name (the published runs those describe). Measured:
    a Llama 3.2 1B step of Hugging Face modules on one H100 is 384 ms; megatron's fused kernels predict 284 ms,
    fsdp 390 ms (validation/h100_train_steps.jsonl, benchmarks/accuracy_h100.py)."""
    if framework:
        return framework
    if (
        isinstance(arg, str)
        and arg not in CATALOG
        and (arg.endswith(".json") or Path(arg).is_file() or ":" in arg)
    ):
        return "fsdp"
    return "megatron"
