"""The one table of option combinations that mean nothing (issue 31): each is refused in one line
naming the options, the values given and what is allowed, by every command that takes them
(estimate, recommend, explain, report, run) through `check_options`.

A rule judges values that are valid one by one (an unknown value is refused by its own check, which
names what is allowed). A rule reads the options by their Python names (`fp8_scaling`,
`recompute_modules`, ...); a name a command does not take is simply absent, and a rule about it does
not apply there. Values a command derives before the check (the hardware profile's price as `price`,
the resolved `precision`) are passed the same way."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from frameworks import FP8_SCALINGS
from planner.errors import ConfigError
from planner.run_options import RunOptions
from frameworks import available_frameworks

Options = Mapping[str, Any]


@dataclass(frozen=True)
class OptionRule:
    """Options that together mean nothing: `refuses(values)` says when, `allowed(values)` what
    would."""

    options: tuple[str, ...]
    """The command-line names involved, first the one refused."""
    refuses: Callable[[Options], bool]
    allowed: Callable[[Options], str]

    def error(self, values: Options) -> ConfigError:
        field = self.options[0]
        given = values.get(_python_name(field))
        shown = ", ".join(
            f"{name} {_shown(values.get(_python_name(name)))}" for name in self.options
        )
        return ConfigError(
            field,
            given,
            self.allowed(values),
            message=f"{shown}: {'this combination means' if len(self.options) > 1 else 'means'} "
            f"nothing; allowed {self.allowed(values)}",
        )


def _python_name(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _shown(value: Any) -> str:
    if value is None:
        return "(default)"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return repr(value) if not isinstance(value, str) or not value.strip() else value


def _given(values: Options, name: str) -> bool:
    return values.get(name) not in (None, False, [], ())


def _framework_names() -> tuple[str, ...]:
    return tuple(available_frameworks())


def _blank_framework(values: Options) -> bool:
    name = values.get("framework")
    return isinstance(name, str) and name.strip() == ""  # '' ran as megatron, silently


def _fp8_switch_rule(name: str) -> OptionRule:
    """An FP8 recipe's switch (a RunOptions switch named fp8_*) is refused without FP8 training."""
    flag = "--" + name.replace("_", "-")
    return OptionRule(
        (flag, "--precision"),
        lambda v: "precision" in v and _given(v, name) and v.get("precision") != "fp8",
        lambda v: f"{flag} only with --precision fp8 (a switch of the FP8 recipe)",
    )


FP8_SWITCHES = tuple(
    f.name for f in fields(RunOptions) if f.name.startswith("fp8_") and f.type.startswith("bool")
)
"""The run options that switch something of an FP8 recipe (each refused without --precision fp8)."""


def fp8_switches(options: RunOptions) -> dict[str, Any]:
    """A run's FP8 switches by name, for check_options from the Python API (estimate, recommend),
    which takes the other options' combinations leniently."""
    return {name: getattr(options, name) for name in FP8_SWITCHES}


RULES: tuple[OptionRule, ...] = (
    OptionRule(
        ("--fp8-scaling", "--precision"),
        lambda v: (
            "precision" in v
            and v.get("fp8_scaling") in FP8_SCALINGS
            and v.get("precision") != "fp8"
        ),
        lambda v: (
            "--fp8-scaling only with --precision fp8 (the granularity of FP8 scaling factors)"
        ),
    ),
    OptionRule(
        ("--recompute-modules", "--recompute"),
        lambda v: (
            "recompute" in v
            and _given(v, "recompute_modules")
            and v.get("recompute") != "selective"
        ),
        lambda v: (
            "--recompute-modules only with --recompute selective (the modules selective "
            "recomputation re-runs)"
        ),
    ),
    OptionRule(
        ("--framework",),
        _blank_framework,
        lambda v: "one of " + ", ".join(_framework_names()) + " (or a framework profile .json)",
    ),
    *(_fp8_switch_rule(name) for name in FP8_SWITCHES),
    OptionRule(
        ("--objective", "--price-per-hour"),
        lambda v: (
            v.get("objective") == "cost"
            and "price" in v
            and v.get("price") is None
            and not _given(v, "price_per_hour")
        ),
        lambda v: (
            f"--objective cost with a price: {v.get('hardware')}'s profile has no "
            "price_usd_per_hour; "
            "pass --price-per-hour USD (per node) where the command takes it, or another objective"
        ),
    ),
)
"""Every refused combination; tests/test_option_rules.py enumerates pairs of run options
against it."""


def check_options(**values: Any) -> None:
    """Raise the first rule's one-line ConfigError that `values` (options by Python name) break."""
    for rule in RULES:
        if rule.refuses(values):
            raise rule.error(values)
