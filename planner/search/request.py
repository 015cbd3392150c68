"""What a search is asked: the model, hardware and world size resolved, the default global batch,
the price per hour and the goodput inputs validated."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from cost_models.compute import resolve_precision
from cost_models.params import total_params
from frameworks.rules import check_moe_runnable, violations
from hardware_profiles import load_profile
from planner.candidates import SearchSpace
from planner.errors import ConfigError
from planner.goodput import ReliabilityInputs
from planner.option_rules import check_options, fp8_switches
from planner.parallel import ParallelConfig
from planner.run_options import RunOptions
from planner.search.space import OBJECTIVES, PREFERENCES, Workload, check_space, narrowed
from planner.sources import resolve_model, transformer_spec, with_seq
from planner.software import (
    check_activation_fp8_input,
    check_fp8_scaling_hardware,
    check_master_weights,
    check_moe_options,
    free_overlaps,
    software_for,
)
from planner.spec import TransformerSpec

REFINE_TOP = 8
"""Leading candidates whose pipeline stages are re-split unevenly and re-scored with estimate()."""


DEFAULT_BATCH_TOKENS = 2**21
"""Default global batch, in tokens: about 2M, inside GPT-3's 0.5M-3.2M range (Brown et al. 2020,
Table 2.1) and Llama 2's 4M (Touvron et al. 2023); rounded up to a multiple of the world size."""


TINY_MODEL_PARAMS = 10_000_000
"""Below this many parameters (no catalog model: GPT-2's 124M is the smallest) a model is a test or
demo model
(planner.executor.tiny), and the default batch is TINY_SEQUENCES_PER_RANK sequences per rank, not
~2M tokens."""


TINY_SEQUENCES_PER_RANK = 4


def default_global_batch(world_size: int, seq: int, params: int | None = None) -> int:
    """About DEFAULT_BATCH_TOKENS tokens, as a multiple of the world size (so every dp divides it);
    for a model of
    fewer than TINY_MODEL_PARAMS parameters, TINY_SEQUENCES_PER_RANK sequences per rank.

    >>> default_global_batch(960, 2048)
    1920
    >>> default_global_batch(8, 4096)
    512
    >>> default_global_batch(4, 32, params=70_000)
    16
    """
    if params is not None and params < TINY_MODEL_PARAMS:
        return world_size * TINY_SEQUENCES_PER_RANK
    sequences = max(1, DEFAULT_BATCH_TOKENS // seq)
    return world_size * math.ceil(sequences / world_size)


def model_params(model) -> int | None:
    """Parameters of a TransformerSpec or a measured ModuleSpec (None for anything else)."""
    if isinstance(model, TransformerSpec):
        return total_params(model)
    params = getattr(model, "params", None)
    return params if isinstance(params, int) else None


def _resolve(model, hardware, gpus, nodes, seq):
    if isinstance(model, str):
        model = resolve_model(model, seq=seq)
    if getattr(model, "spec", None) is not None and getattr(model, "factory", None):
        model = transformer_spec(model)  # a factory's module that describes its transformer
    elif seq is not None and getattr(model, "seq", seq) != seq:
        model = with_seq(model, seq)
    if isinstance(hardware, str):
        hardware = load_profile(hardware)
    per_node = hardware.devices_per_node
    if gpus is None and nodes is None:
        raise ConfigError("gpus", None, "--gpus N or --nodes K")
    if gpus is not None and nodes is not None and gpus != nodes * per_node:
        raise ConfigError(
            "gpus",
            gpus,
            f"nodes({nodes})*devices_per_node({per_node})={nodes * per_node}, or give one of them",
        )
    world = gpus if gpus is not None else nodes * per_node
    return model, hardware, world, math.ceil(world / per_node)


def _price_per_hour(
    hardware, nodes: int, spot: bool, node_price: float | None = None
) -> float | None:
    """Dollars per hour for `nodes` nodes: `node_price` (the user's own price: negotiated, reserved or
    today's spot) when given, else the profile's on-demand or spot price."""
    if node_price is not None:
        if not (
            isinstance(node_price, (int, float)) and math.isfinite(node_price) and node_price > 0
        ):
            raise ConfigError(
                "price-per-hour", node_price, "a positive number of US dollars per node-hour"
            )
        return float(node_price) * nodes
    price = hardware.spot_price_usd_per_hour if spot else hardware.price_usd_per_hour
    if spot and price is None:
        raise ConfigError(
            "spot",
            True,
            f"a spot price: {hardware.name}'s profile has none (spot prices move "
            "daily); pass today's with --price-per-hour USD (per node)",
        )
    return None if price is None else price * nodes


def _reliability_inputs(inputs, *, objective: str, tokens: float | None, spot: bool):
    """The goodput inputs, validated before the search (one ConfigError naming the flag)."""
    inputs = ReliabilityInputs() if inputs is None else inputs
    if objective == "time-to-train" and not tokens:
        raise ConfigError(
            "tokens",
            tokens,
            "a training length with --objective time-to-train",
            message="--objective time-to-train needs --tokens N (the length of the run, e.g. 300B)",
        )
    if inputs.given and not tokens:
        flag = inputs.given[0]
        raise ConfigError(
            flag.lstrip("-"),
            getattr(inputs, flag.lstrip("-").replace("-", "_")),
            "--tokens N as well",
            message=f"{flag} needs --tokens N: goodput is computed for a run of N tokens",
        )
    if inputs.spot_interruptions_per_node_hour is not None and not spot:
        raise ConfigError(
            "spot-interruptions-per-node-hour",
            inputs.spot_interruptions_per_node_hour,
            "only with --spot (on-demand nodes are not reclaimed)",
        )
    if spot and objective == "time-to-train" and inputs.spot_interruptions_per_node_hour is None:
        raise ConfigError(
            "spot-interruptions-per-node-hour",
            None,
            "your spot reclaim rate per node-hour with --spot "
            "--objective time-to-train (it varies by instance type, zone and hour; no default)",
            message="--spot with --objective time-to-train needs --spot-interruptions-per-node-hour "
            "RATE (reclaims per node-hour; it varies by instance type, zone and hour, so the "
            "planner has no default)",
        )
    return inputs.validated()


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """What recommend() is asked beside the model and the hardware: its keywords as one record
    (`recommend(model, hardware, request)` and `recommend(model, hardware, **fields)` are the same)."""

    gpus: int | None = None
    """The world size (or `nodes`, whole nodes of the profile)."""
    nodes: int | None = None
    global_batch: int | None = None
    """None: default_global_batch."""
    seq: int | None = None
    """None: the model's."""
    precision: str | None = None
    """None: bf16 mixed precision where the device has bf16 (cost_models.compute.resolve_precision)."""
    optimizer: str = "adamw"
    objective: str = "throughput"
    """One of OBJECTIVES."""
    prefer: str = "headroom"
    """Among near-ties, the plan ranked first (PREFERENCES; planner.uncertainty)."""
    top: int = 5
    """Plan documents returned: the winner and top - 1 runners-up."""
    spot: bool = False
    price_per_hour: float | None = None
    """The user's price per node-hour (None: the profile's on-demand or spot price)."""
    tokens: float | None = None
    """The length of the run: with it every plan document carries its goodput (planner.goodput)."""
    space: SearchSpace = SearchSpace()
    refine: int = REFINE_TOP
    """Leaders re-split into uneven stages and re-scored (planner.search.refine)."""
    framework: str = "megatron"
    options: RunOptions | None = None
    """Run options (None or an unset field: the framework's default)."""
    reliability: Any = None
    """planner.goodput.ReliabilityInputs (None: the sourced defaults)."""
    progress: Callable[[int, int], None] | None = None
    score_fn: Callable | None = None
    """Instead of planner.score.score (tests, the report's recording scorer)."""
    estimate_fn: Callable | None = None
    """Instead of planner.estimate.estimate (tests)."""

    @property
    def leaders(self) -> int:
        """Candidates documented: the top ones and those refined, and one more."""
        return max(self.top, self.refine) + 1


@dataclass(frozen=True, kw_only=True)
class Setup:
    """A request resolved and checked (`prepare`): what the search, the refinement and the
    documents read."""

    request: SearchRequest
    model: Any
    hardware: Any
    software: Any
    options: RunOptions
    workload: Workload
    space: SearchSpace
    """The request's space as the framework and the run options narrow it."""
    held: dict[str, str]
    """Knobs a run option holds out of the space, each with the option (no_fit_error's `held`)."""
    price: float | None
    """Dollars per hour for the whole world (None: no price known)."""
    reliability: Any
    """The validated goodput inputs."""
    free_overlaps: tuple[str, ...] = ()
    """Overlap options the search chooses per plan (planner.software.free_overlaps; the memory
    objective keeps the framework's defaults: the overlaps buy time with memory)."""


def prepare(model, hardware, request: SearchRequest) -> Setup:
    """Check and resolve a request before any search: one ConfigError naming the flag for bad input."""
    r = request
    if r.objective not in OBJECTIVES:
        raise ConfigError("objective", r.objective, "one of " + ", ".join(OBJECTIVES))
    if r.prefer not in PREFERENCES:
        raise ConfigError("prefer", r.prefer, "one of " + ", ".join(PREFERENCES))
    if r.top < 1:
        raise ConfigError("top", r.top, "a positive integer")
    reliability = _reliability_inputs(
        r.reliability, objective=r.objective, tokens=r.tokens, spot=r.spot
    )
    model, hardware, world, n_nodes = _resolve(model, hardware, r.gpus, r.nodes, r.seq)
    options = r.options or RunOptions()
    software = software_for(r.framework, options)
    precision = _checked_stack(model, hardware, software, options, r)
    seq = r.seq or model.seq
    check_space(r.space, model, software.framework, world=world, seq=seq)
    space, held = narrowed(
        r.space.for_framework(software.framework, model), software, model, options
    )
    global_batch = r.global_batch or default_global_batch(world, seq, model_params(model))
    price = _price_per_hour(hardware, n_nodes, r.spot, r.price_per_hour)
    # the one rule (planner.option_rules), for the Python API as for the commands
    check_options(
        **fp8_switches(options),
        precision=precision,
        objective=r.objective,
        hardware=hardware.name,
        price=price,
        price_per_hour=r.price_per_hour,
    )
    workload = Workload(
        world_size=world,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=r.optimizer,
        framework=software.framework.name,
    )
    return Setup(
        request=r,
        model=model,
        hardware=hardware,
        software=software,
        options=options,
        workload=workload,
        space=space,
        held=held,
        price=price,
        reliability=reliability,
        free_overlaps=()
        if r.objective == "memory"
        else free_overlaps(software, options, model, precision=precision),
    )


def _checked_stack(model, hardware, software, options: RunOptions, request: SearchRequest) -> str:
    """The precision (request.precision resolved), once the stack can run it with the model, the run
    options and the optimizer whatever the degrees."""
    check_activation_fp8_input(software, model)
    precision = resolve_precision(
        hardware, request.precision
    )  # None: bf16 mixed precision where the device has bf16
    check_moe_options(model, precision, options)
    # what the stack cannot run whatever the degrees (the overlap's per-plan conditions restrict the space below)
    check_moe_runnable(
        software.framework,
        software,
        model,
        ParallelConfig(
            dp=2,
            ep=2,
            global_batch=2,
            placement="PDET",
            precision=precision,
            framework=software.framework.name,
        ),
    )
    check_master_weights(software, precision)
    check_fp8_scaling_hardware(software, hardware, precision)
    ParallelConfig(
        precision=precision, optimizer=request.optimizer, framework=software.framework.name
    )  # validates them
    problems = violations(
        software.framework, ParallelConfig(precision=precision, framework=software.framework.name)
    )
    if problems:
        raise ConfigError(
            "precision",
            precision,
            f"a precision {software.framework.name} runs",
            message=f"framework {software.framework.name} cannot run this plan: {problems[0]}",
        )
    return precision
