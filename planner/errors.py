"""The three kinds of failure (docs/style.md): bad input, no feasible plan, and bugs (plain asserts).

The CLI turns a `PlannerError` into one line on stderr and its `exit_code`; nothing else of the
exception reaches the user.
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base of the user-facing errors; `exit_code` is what the CLI exits with."""

    exit_code = 2


class ConfigError(PlannerError):
    """Malformed input: names the field, the value given and what is allowed.

    >>> str(ConfigError("tp", 3, "a divisor of heads(32): 1, 2, 4, 8, 16, 32"))
    'tp=3 is invalid: allowed a divisor of heads(32): 1, 2, 4, 8, 16, 32'
    """

    exit_code = 2

    def __init__(self, field: str, value: object, allowed: str, *, message: str | None = None):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(message or f"{field}={value!r} is invalid: allowed {allowed}")


class NoFitError(PlannerError):
    """Valid input, but no candidate fits in memory; the message says by how much and what would help."""

    exit_code = 3
