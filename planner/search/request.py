"""What a search is asked: the model, hardware and world size resolved, the default global batch,
the price per hour and the goodput inputs validated."""

from __future__ import annotations

import math

from cost_models.params import total_params
from planner.errors import ConfigError
from planner.spec import TransformerSpec


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
        from planner.sources import resolve_model

        model = resolve_model(model, seq=seq)
    if getattr(model, "spec", None) is not None and getattr(model, "factory", None):
        from planner.sources import transformer_spec

        model = transformer_spec(model)  # a factory's module that describes its transformer
    elif seq is not None and getattr(model, "seq", seq) != seq:
        from planner.sources import with_seq

        model = with_seq(model, seq)
    if isinstance(hardware, str):
        from hardware_profiles import load_profile

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
    from planner.goodput import ReliabilityInputs

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
