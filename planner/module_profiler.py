"""Measure any `nn.Module` (a `package.module:factory`) on the meta device: no parameter memory.

`module_spec(arg, seq=..., micro_batch=...) -> ModuleSpec` imports the factory, builds the module
under `torch.device("meta")`, and runs forward and backward passes that allocate nothing:
- FLOPs per unit from torch.utils.flop_counter's formulas (the ones FlopCounterMode applies),
  counted by a dispatch mode that attributes each op to the unit running it (module pre/post
  hooks; in backward, full-backward pre-hooks). Forward FLOPs come from the whole-model forward;
  backward FLOPs, with and without recomputation, from each distinct unit run alone on the
  arguments it received (see `measure`), so a 96-block model runs one block's backward, not 96.
- Activation bytes from what autograd saves (torch.autograd.graph.saved_tensors_hooks), deduped
  by storage (a view saved twice costs once) and excluding parameters, for recompute "none"
  (whole-model forward), "selective" (every SDPA call wrapped in non-reentrant checkpoint,
  Korthikanti et al. 2022) and "full" (the block wrapped in non-reentrant checkpoint); the last two
  as the change checkpointing makes to each distinct block run alone (see `measure`).
- Attention: on the meta device SDPA falls back to the math path, which saves the s x s
  probabilities and whose backward FLOPs differ from a flash kernel's. With `flash=True` (the
  default) every `F.scaled_dot_product_attention` call is routed to the CPU flash kernel, which has
  meta implementations, through an autograd.Function that saves what a flash kernel saves: Q, K,
  V (GQA heads unexpanded), the output (in the (b, s, a, d) layout the real kernels return, so the
  output projection's input shares its storage) and the fp32 logsumexp. FLOPs of the CPU flash
  ops are counted with torch's own sdpa formulas (FlopCounterMode has none for them).
- Units: the root's children in order, containers (ModuleList, ModuleDict, Sequential) expanded;
  items of a container are "block" units (checkpointed under "full"), others keep their class name.
  Parameters held by several modules are reported in `shared_params` and counted once, in the
  first unit that owns them.

Inputs: the module's own `example_inputs(micro_batch, seq)` if it has one, otherwise token ids of
shape (micro_batch, seq) when the module has an `nn.Embedding` (the first one sets the vocabulary).
If the output has a trailing dimension equal to that vocabulary it is treated as logits and the
loss is next-token cross entropy on fp32-upcast logits (as Megatron and Hugging Face do); otherwise
the loss is the sum of the output.

Precision: fp32 runs the module in fp32; bf16 and amp-* run it in bf16 (amp-fp16 in fp16): the
meta device has no autocast, so amp's fp32 residual stream is not reproduced (the analytic
profiler models it).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as TF
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import (
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)

from planner.errors import ConfigError
from planner.profile_records import RECOMPUTE_MODES, LayerProfile, ModelProfile
from planner.progress import working
from planner.spec import TransformerSpec, with_seq

from planner.hf_config import spec_from_dict
from planner.usercode import user_code, user_roots

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
_DTYPES = {
    "fp32": torch.float32,
    "amp-bf16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "amp-fp16": torch.float16,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleSpec:
    """What `resolve_model('package.module:factory')` returns: a measured nn.Module.

    The numbers are for one micro-batch of `micro_batch` sequences of `seq` tokens;
    `planner.profiler.profile_model(module_spec, micro_batch=..., seq=...)` re-measures at another size.
    """

    name: str
    """The 'package.module:factory' string."""
    factory: str
    """Same string, kept for re-profiling."""
    seq: int
    """Tokens per sequence of the measurement."""
    micro_batch: int
    """Sequences per micro-batch of the measurement."""
    precision: str
    """Precision the module was run in."""
    params: int
    """Parameters, shared tensors counted once."""
    units: tuple[LayerProfile, ...]
    """Pipeline-splittable units in execution order (embedding, blocks, head, ..., 'loss')."""
    modules: tuple[LayerProfile, ...]
    """Every module of the tree by qualified name: params (own, recursive) and forward FLOPs."""
    shared_params: tuple[tuple[str, ...], ...]
    """Groups of parameter names that are one tensor (e.g. tied embedding and LM head)."""
    has_batchnorm: bool
    """The module holds a BatchNorm (its statistics depend on the per-rank micro-batch)."""
    spec: TransformerSpec | None = None
    """The transformer the module says it is: its `.spec` when that is a TransformerSpec (the reference
    Transformer), else its Hugging Face-style `.config` read by planner.hf_config; None otherwise."""
    profile: ModelProfile | None = field(default=None, compare=False)
    """The same measurement as a ModelProfile (what `planner profile` prints)."""

    @property
    def total_blocks(self) -> int:
        """Units that are blocks of a container (what a pipeline splits)."""
        return sum(1 for unit in self.units if unit.kind == "block")


# --- flash attention on meta -------------------------------------------------------------------


def _flash_fwd_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _flash_bwd_flops(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


CPU_FLASH_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _flash_fwd_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _flash_bwd_flops,
}
"""FLOP formulas (on shapes) for the CPU flash ops: FlopCounterMode(custom_mapping=CPU_FLASH_FLOPS)."""


class _FlashAttention(torch.autograd.Function):
    """SDPA through the CPU flash kernel, saving exactly what a flash kernel keeps for backward."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, scale=scale
        )
        # Real flash kernels return (b, a, s, d) views of a (b, s, a, d) buffer.
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, ctx.is_causal, scale=ctx.scale
        )
        return dq, dk, dv, None, None


def _sdpa_replacement(original, *, flash: bool, selective: bool):
    def sdpa(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        if flash and attn_mask is None and dropout_p == 0.0:
            if key.shape[-3] != query.shape[-3] and not enable_gqa:
                raise ValueError("key/value heads differ from query heads without enable_gqa")

            def core(q, k, v):
                return _FlashAttention.apply(q, k, v, is_causal, scale)
        else:

            def core(q, k, v):
                return original(
                    q,
                    k,
                    v,
                    attn_mask=attn_mask,
                    dropout_p=dropout_p,
                    is_causal=is_causal,
                    scale=scale,
                    enable_gqa=enable_gqa,
                )

        if selective and torch.is_grad_enabled():
            return checkpoint(core, query, key, value, use_reentrant=False)
        return core(query, key, value)

    return sdpa


@contextlib.contextmanager
def _patched_sdpa(*, flash: bool, selective: bool):
    original = TF.scaled_dot_product_attention
    if not flash and not selective:
        yield
        return
    TF.scaled_dot_product_attention = _sdpa_replacement(original, flash=flash, selective=selective)
    try:
        yield
    finally:
        TF.scaled_dot_product_attention = original


# --- attribution of ops and saved tensors to units ------------------------------------------------


class _UnitTracker:
    """Which unit is running: forward by pre/post hooks, backward by full-backward pre-hooks."""

    def __init__(self, units: dict[str, nn.Module], outside: str = "loss"):
        self.stack: list[str] = []
        self.backward_unit = outside
        self.outside = outside
        self.handles = []
        for name, module in units.items():
            self.handles.append(module.register_forward_pre_hook(partial(self._enter, name)))
            self.handles.append(
                module.register_forward_hook(partial(self._leave, name), always_call=True)
            )
            self.handles.append(
                module.register_full_backward_pre_hook(partial(self._backward, name))
            )

    def _enter(self, name, module, args):
        self.stack.append(name)

    def _leave(self, name, module, args, output):
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def _backward(self, name, module, grad_output):
        self.backward_unit = name

    @property
    def current(self) -> str:
        if torch._C._current_autograd_node() is not None:
            return self.backward_unit
        return self.stack[-1] if self.stack else self.outside

    def close(self):
        for handle in self.handles:
            handle.remove()


class _UnitFlops(TorchDispatchMode):
    """Counts FLOPs with FlopCounterMode's formulas, per unit and per phase (forward/backward)."""

    def __init__(self, tracker: _UnitTracker):
        super().__init__()
        self.tracker = tracker
        self.forward: dict[str, float] = defaultdict(float)
        self.backward: dict[str, float] = defaultdict(float)
        self.registry = dict(flop_registry) | {
            op: shape_wrapper(f) for op, f in CPU_FLASH_FLOPS.items()
        }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            flops = formula(*args, **kwargs, out_val=out)
            in_backward = torch._C._current_autograd_node() is not None
            (self.backward if in_backward else self.forward)[self.tracker.current] += flops
        return out


def storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's storage (works on meta, where data pointers are all 0)."""
    return t.untyped_storage()._cdata


class SavedTensors:
    """saved_tensors_hooks that sum the bytes of distinct non-parameter storages, per unit."""

    def __init__(self, model: nn.Module, tracker: _UnitTracker):
        self.params = {storage_key(p) for p in model.parameters()} | {
            storage_key(b) for b in model.buffers()
        }
        self.tracker = tracker
        self.seen: set[int] = set()
        self.bytes: dict[str, int] = defaultdict(int)

    def pack(self, t: torch.Tensor):
        key = storage_key(t)
        if key not in self.params and key not in self.seen:
            self.seen.add(key)
            self.bytes[self.tracker.current] += t.untyped_storage().nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


# --- the nn.Module tree ---------------------------------------------------------------------------


def find_units(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(qualified name, module, kind) of the pipeline units: root children, containers expanded."""
    units: list[tuple[str, nn.Module, str]] = []

    def walk(prefix: str, module: nn.Module, in_container: bool) -> None:
        for name, child in module.named_children():
            if child is None:
                continue
            qual = f"{prefix}{name}"
            if isinstance(child, _CONTAINERS):
                walk(qual + ".", child, True)
            else:
                units.append((qual, child, "block" if in_container else type(child).__name__))

    walk("", model, False)
    return units


def shared_parameter_groups(model: nn.Module) -> tuple[tuple[str, ...], ...]:
    """Names that refer to one parameter tensor (same object or same storage)."""
    groups: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        groups[storage_key(p)].append(name)
    return tuple(tuple(names) for names in groups.values() if len(names) > 1)


def unique_params(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        key = storage_key(p)
        if key not in seen:
            seen.add(key)
            total += p.numel()
    return total


def _unit_params(model: nn.Module, units: list[tuple[str, nn.Module, str]]) -> dict[str, int]:
    owned: set[int] = set()
    counts: dict[str, int] = {}
    for name, module, _ in units:
        n = 0
        for p in module.parameters():
            key = storage_key(p)
            if key not in owned:
                owned.add(key)
                n += p.numel()
        counts[name] = n
    rest = sum(p.numel() for p in model.parameters() if storage_key(p) not in owned)
    if rest:
        counts["(root)"] = rest
    return counts


def _first_embedding(model: nn.Module) -> nn.Embedding | None:
    return next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)


def _inputs_and_loss(model: nn.Module, micro_batch: int, seq: int, device):
    """Example inputs and a loss function for `model` (see the module docstring)."""
    if hasattr(model, "example_inputs"):
        with torch.device(device):
            inputs = tuple(model.example_inputs(micro_batch, seq))
        # floating inputs in the dtype the module was cast to (the profiler runs it in the precision's dtype)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        inputs = tuple(
            (
                x.to(device=device, dtype=dtype)
                if dtype is not None and x.is_floating_point()
                else x.to(device)
            )
            if isinstance(x, torch.Tensor)
            else x
            for x in inputs
        )
        return inputs, lambda out: out if out.dim() == 0 else out.float().sum()
    embedding = _first_embedding(model)
    if embedding is None:
        raise ConfigError(
            "MODEL",
            type(model).__name__,
            "an nn.Module with an nn.Embedding input or an example_inputs(micro_batch, seq) method",
        )
    tokens = torch.zeros((micro_batch, seq), dtype=torch.long, device=device)
    vocab = embedding.num_embeddings

    def loss(out):
        if out.dim() == 3 and out.shape[-1] == vocab:
            return TF.cross_entropy(out.float().flatten(0, 1), tokens.flatten(0, 1))
        return out.float().sum()

    return (tokens,), loss


@contextlib.contextmanager
def _checkpointed_blocks(units: list[tuple[str, nn.Module, str]]):
    """Full recomputation: every block unit's forward wrapped in non-reentrant checkpoint."""
    patched = []
    for _, module, kind in units:
        if kind == "block":
            original = module.forward
            module.forward = partial(checkpoint, original, use_reentrant=False)
            patched.append((module, original))
    try:
        yield
    finally:
        for module, _ in patched:
            del module.forward


def measure_step(
    model: nn.Module,
    inputs: tuple,
    loss_fn,
    units: list[tuple[str, nn.Module, str]] | None = None,
    *,
    backward: bool = True,
    count_flops: bool = True,
    record_inputs: bool = False,
) -> dict:
    """One forward (+ backward) of `model` as it is: per-unit saved bytes and forward/backward FLOPs.
    Returns {"saved": {unit: bytes}, "flops_fwd": {...}, "flops_bwd": {...}, "inputs": {unit: (args, kwargs)}};
    `record_inputs` keeps the detached arguments of each unit's first call (for `block_recompute_flops`)."""
    units = find_units(model) if units is None else units
    tracker = _UnitTracker({name: module for name, module, _ in units})
    saved = SavedTensors(model, tracker)
    counter = _UnitFlops(tracker) if count_flops else contextlib.nullcontext()
    recorded: dict[str, tuple] = {}
    handles = []
    if record_inputs:

        def record(name, module, args, kwargs):
            if name not in recorded:
                recorded[name] = _detach((args, kwargs))

        handles = [
            module.register_forward_pre_hook(partial(record, name), with_kwargs=True)
            for name, module, _ in units
        ]
    try:
        with counter, warnings.catch_warnings():
            # Units whose inputs need no grad (the embedding) still get their backward pre-hook.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            with saved.hooks():
                out = model(*inputs)
                loss = loss_fn(out)
            if backward:
                loss.backward()
    finally:
        tracker.close()
        for handle in handles:
            handle.remove()
    model.zero_grad(set_to_none=True)
    flops = counter if count_flops else None
    return {
        "saved": dict(saved.bytes),
        "flops_fwd": dict(flops.forward) if flops else {},
        "flops_bwd": dict(flops.backward) if flops else {},
        "inputs": recorded,
    }


def _detach(tree):
    """Detached copies of the tensors in nested args (same requires_grad), for re-running a unit."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().requires_grad_(tree.requires_grad)
    if isinstance(tree, (tuple, list)):
        return type(tree)(_detach(x) for x in tree)
    if isinstance(tree, dict):
        return {k: _detach(v) for k, v in tree.items()}
    return tree


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            yield from _tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _tensors(x)


def _signature(module: nn.Module, recorded) -> tuple:
    """Units with equal signatures compute the same thing on the same shapes (identical blocks)."""

    def shapes(tree):
        if isinstance(tree, torch.Tensor):
            return (tuple(tree.shape), tree.dtype, tree.requires_grad)
        if isinstance(tree, (tuple, list)):
            return tuple(shapes(x) for x in tree)
        if isinstance(tree, dict):
            return tuple((k, shapes(v)) for k, v in sorted(tree.items()))
        return repr(tree)

    params = tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters())
    return (type(module), params, shapes(recorded))


def _unit_backward_flops(module: nn.Module, recorded, *, flash: bool, mode: str) -> float:
    """Backward FLOPs of one unit run alone on its recorded inputs, with `mode` recomputation."""
    args, kwargs = _detach(recorded)
    tracker = _UnitTracker({"unit": module}, outside="unit")
    counter = _UnitFlops(tracker)
    full = (
        _checkpointed_blocks([("unit", module, "block")])
        if mode == "full"
        else contextlib.nullcontext()
    )
    try:
        with (
            _patched_sdpa(flash=flash, selective=mode == "selective"),
            full,
            counter,
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            out = module(*args, **kwargs)
            out = (
                out
                if isinstance(out, torch.Tensor)
                else next(t for t in out if isinstance(t, torch.Tensor))
            )
            if not out.requires_grad:
                return 0.0
            out.float().sum().backward()
    finally:
        tracker.close()
    module.zero_grad(set_to_none=True)
    return float(sum(counter.backward.values()))


def _unit_saved_bytes(module: nn.Module, recorded, *, flash: bool, mode: str) -> int:
    """Bytes saved by one forward of the unit alone on its recorded arguments, with `mode` recomputation."""
    args, kwargs = _detach(recorded)
    tracker = _UnitTracker({}, outside="unit")
    saved = SavedTensors(module, tracker)
    # Constants passed in (RoPE tables, masks) belong to the whole model, not to this unit's change:
    # checkpoint keeps them by reference (not through saved-tensor hooks), so leave them out of both sides.
    saved.params |= {storage_key(t) for t in _tensors((args, kwargs)) if not t.requires_grad}
    full = (
        _checkpointed_blocks([("unit", module, "block")])
        if mode == "full"
        else contextlib.nullcontext()
    )
    with _patched_sdpa(flash=flash, selective=mode == "selective"), full, saved.hooks():
        module(*args, **kwargs)
    return saved.bytes.get("unit", 0)


def measure(model: nn.Module, inputs: tuple, loss_fn, *, flash: bool = True) -> dict:
    """Per-unit FLOPs (forward, backward, recompute) and saved bytes (none/selective/full) of one
    training step of `model` on `inputs` (any device; meta allocates nothing).

    One forward of the whole model gives the forward FLOPs and the saved bytes per unit without
    recomputation. The "selective" and "full" bytes of a block add to those what checkpointing its
    attention core / the whole block changes when the block runs alone (forward, saved-tensor
    hooks), a difference in which storages shared between blocks (RoPE tables) cancel; units
    that are not blocks are not checkpointed. Backward FLOPs are measured per unit, running the unit alone on the arguments it received
    (backward of the sum of its output) with and without recomputation; units with the same class,
    parameter shapes and argument shapes (the blocks of a transformer) are measured once. Work
    outside every unit (the loss, glue in the root's forward) is costed at 2x its forward FLOPs, the
    GEMM rule (cross entropy itself has no GEMM). A unit called twice is charged one backward.
    """
    units = find_units(model)
    result: dict = {
        "units": units,
        "saved": {},
        "flops_bwd": {},
        "recompute": {m: {} for m in RECOMPUTE_MODES},
    }
    with _patched_sdpa(flash=flash, selective=False):
        step = measure_step(model, inputs, loss_fn, units, backward=False, record_inputs=True)
    result["saved"]["none"] = step["saved"]
    result["flops_fwd"] = step["flops_fwd"]
    result["saved"]["selective"] = dict(step["saved"])
    result["saved"]["full"] = dict(step["saved"])
    cache: dict[tuple, dict[str, float]] = {}
    for name, module, kind in units:
        if name not in step["inputs"]:
            continue
        recorded = step["inputs"][name]
        key = (kind, _signature(module, recorded))
        if key not in cache:
            modes = ("none", "selective", "full") if kind == "block" else ("none",)
            cache[key] = {
                m: _unit_backward_flops(module, recorded, flash=flash, mode=m) for m in modes
            }
            cache[key]["saved"] = {
                m: _unit_saved_bytes(module, recorded, flash=flash, mode=m) for m in modes
            }
        result["flops_bwd"][name] = cache[key]["none"]
        for mode in ("selective", "full"):
            if mode in cache[key]:
                result["recompute"][mode][name] = cache[key][mode] - cache[key]["none"]
                delta = cache[key]["saved"][mode] - cache[key]["saved"]["none"]
                result["saved"][mode][name] = result["saved"]["none"].get(name, 0) + delta
    unit_names = {name for name, _, _ in units}
    for name, flops in step["flops_fwd"].items():
        if name not in unit_names:
            result["flops_bwd"][name] = 2.0 * flops
    return result


def load_factory(arg: str):
    """Import 'package.module:factory' and return the callable; ConfigError naming what failed (an
    exception raised while importing names the user's file and line, planner.usercode)."""
    module_name, _, attr = arg.partition(":")
    if not module_name or not attr:
        raise ConfigError("MODEL", arg, "package.module:factory")
    top = module_name.split(".")[0]
    if os.getcwd() not in sys.path and _find_spec(top) is None:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: modules of the current directory
    with user_code(arg, f"importing {module_name}", user_roots(module_name)):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
                raise ConfigError(
                    "MODEL", arg, f"an importable module; {err.name!r} was not found"
                ) from None
            raise  # a module the user's module imports is missing
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError("MODEL", arg, f"a callable {attr!r} in module {module_name}")
    if not callable(factory):
        raise ConfigError("MODEL", arg, f"a callable; {attr!r} is a {type(factory).__name__}")
    return factory


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def build_on_meta(arg: str, precision: str = "fp32") -> nn.Module:
    """Call the factory under torch.device('meta') and cast to the profiling dtype (importing, calling
    and casting run as the user's code: one-line errors and the time limit of planner.usercode)."""
    roots = user_roots(arg.partition(":")[0])
    with user_code(arg, "the factory", roots):
        factory = load_factory(arg)
        with torch.device("meta"):
            model = factory()
        if not isinstance(model, nn.Module):
            raise ConfigError(
                "MODEL", arg, f"a factory returning an nn.Module, not {type(model).__name__}"
            )
        if any(p.device.type != "meta" for p in model.parameters()):
            model = model.to("meta")  # the factory placed parameters explicitly; drop them
        return model.to(_DTYPES[precision])


def _spec_from_hf_config(config, name: str, seq: int | None) -> TransformerSpec | None:
    """A Hugging Face-style `.config` (an object with to_dict(), or a dict, holding model_type) as the
    TransformerSpec it describes (planner.hf_config); None when there is none or it is not one of
    the supported model types."""
    data = config.to_dict() if hasattr(config, "to_dict") else config
    if not isinstance(data, dict) or "model_type" not in data:
        return None

    try:
        return spec_from_dict(data, name=name, seq=seq)
    except ConfigError:
        return None


def profile_module(
    arg: str,
    *,
    seq: int | None = None,
    micro_batch: int = 1,
    precision: str = "amp-bf16",
    flash: bool = True,
) -> ModuleSpec | TransformerSpec:
    """Measure `package.module:factory` on the meta device (see the module docstring). A factory
    returning the planner's own mixture-of-experts Transformer is costed from its spec, as a
    catalog model: its token routing (torch.nonzero, data-dependent) has no meta-device kernel,
    and the spec is exactly what it builds."""
    if precision not in _DTYPES:
        raise ConfigError("precision", precision, "one of " + ", ".join(_DTYPES))
    traced = _trace_on_meta(arg, seq, micro_batch, precision, flash)
    if isinstance(traced, TransformerSpec):
        return traced
    model, spec, s, m = traced
    units = _unit_profiles(model, m)
    modules = _module_profiles(model)
    total = unique_params(model)
    shared = shared_parameter_groups(model)
    has_bn = any(isinstance(mod, nn.modules.batchnorm._BatchNorm) for mod in model.modules())
    description = {
        "name": arg,
        "factory": arg,
        "class": type(model).__name__,
        "params": total,
        "blocks": sum(1 for u in units if u.kind == "block"),
        "seq": s,
        "shared_params": [list(g) for g in shared],
        "has_batchnorm": has_bn,
    }
    profile = ModelProfile(
        model=description,
        seq=s,
        micro_batch=micro_batch,
        precision=precision,
        flash=flash,
        params=total,
        layers=units,
        method="meta-device measurement",
        extra={"shared_params": [list(g) for g in shared]},
    )
    return ModuleSpec(
        name=arg,
        factory=arg,
        seq=s,
        micro_batch=micro_batch,
        precision=precision,
        params=total,
        units=units,
        modules=modules,
        shared_params=shared,
        has_batchnorm=has_bn,
        spec=spec,
        profile=profile,
    )


def _trace_on_meta(arg: str, seq: int | None, micro_batch: int, precision: str, flash: bool):
    """Build the factory's model on the meta device and measure one forward/backward:
    (model, its TransformerSpec or None, sequence, measurements); or, for the planner's own
    mixture-of-experts Transformer, its spec (costed as a catalog model)."""
    # one time limit for importing, building and tracing (planner.usercode)
    roots = user_roots(arg.partition(":")[0])
    with (
        working(f"tracing {arg} on the meta device"),
        user_code(arg, "its forward/backward on the meta device", roots),
    ):
        model = build_on_meta(arg, precision)
        spec = getattr(model, "spec", None)
        if isinstance(spec, TransformerSpec) and spec.moe is not None:
            return with_seq(spec, seq)
        if not isinstance(spec, TransformerSpec):
            spec = _spec_from_hf_config(getattr(model, "config", None), arg, seq)
        s = seq or (spec.seq if spec else 2048)
        inputs, loss_fn = _inputs_and_loss(model, micro_batch, s, "meta")
        model.train()
        m = measure(model, inputs, loss_fn, flash=flash)
    return model, spec, s, m


def _unit_profiles(model: nn.Module, m: dict) -> tuple[LayerProfile, ...]:
    """One LayerProfile per measured unit (then the root's own parameters, then the loss)."""
    params = _unit_params(model, m["units"])
    names = [name for name, _, _ in m["units"]] + [n for n in ("(root)",) if n in params] + ["loss"]
    kinds = {name: kind for name, _, kind in m["units"]} | {"(root)": "parameters", "loss": "loss"}
    return tuple(
        LayerProfile(
            name=name,
            kind=kinds[name],
            params=params.get(name, 0),
            flops_fwd=float(m["flops_fwd"].get(name, 0.0)),
            flops_bwd=float(m["flops_bwd"].get(name, 0.0)),
            activation_bytes={mode: int(m["saved"][mode].get(name, 0)) for mode in RECOMPUTE_MODES},
            recompute_flops={
                mode: float(m["recompute"][mode].get(name, 0.0)) for mode in RECOMPUTE_MODES
            },
        )
        for name in names
    )


def _module_profiles(model: nn.Module) -> tuple[LayerProfile, ...]:
    """Every named submodule: its class and parameter count."""
    return tuple(
        LayerProfile(
            name=name,
            kind=type(mod).__name__,
            params=sum(p.numel() for p in mod.parameters()),
            flops_fwd=0.0,
            flops_bwd=0.0,
        )
        for name, mod in model.named_modules()
        if name
    )
