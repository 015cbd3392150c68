"""`planner models [--json]`: the model catalog (planner.catalog) with each model's size and
shape."""

from __future__ import annotations

import typer

from cost_models.params import active_params, total_params
from planner.catalog import get, names
from planner.commands.common import JsonOpt, emit_json


def models(json_out: JsonOpt = False) -> None:
    """The catalog's models: parameters, blocks, width, heads, experts, default sequence and source
    (MODEL names)."""
    rows = catalog_rows()
    if json_out:
        emit_json({"models": rows})
        return
    headers = ("name", "params", "active", "blocks", "hidden", "heads", "experts", "seq")
    cells = [
        [
            r["name"],
            _billions(r["params"]),
            _billions(r["active_params"]),
            str(r["layers"]),
            str(r["hidden"]),
            str(r["heads"]),
            r["experts"] or "-",
            str(r["seq"]),
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(
        v.ljust(w) if i == 0 else v.rjust(w)  # noqa: E731
        for i, (v, w) in enumerate(zip(values, widths))
    )
    typer.echo(line(headers))
    typer.echo("  ".join("-" * w for w in widths))
    for c in cells:
        typer.echo(line(c))
    typer.echo(
        "params: all parameters; active: those one token uses (the routed experts it is sent to); "
        "use a name as MODEL, or a config.json path or package.module:factory"
    )


def catalog_rows() -> list[dict]:
    """One record per catalog model: its shape and parameter counts (cost_models.params)."""
    rows = []
    for name in names():
        spec = get(name)
        moe = spec.moe
        rows.append(
            {
                "name": name,
                "params": total_params(spec),
                "active_params": active_params(spec),
                "layers": spec.layers,
                "hidden": spec.hidden,
                "heads": spec.heads,
                "seq": spec.seq,
                "experts": f"{moe.experts} (top-{moe.top_k})" if moe else None,
                "model_type": spec.model_type,
            }
        )
    return rows


def _billions(n: int) -> str:
    return f"{n / 1e9:,.1f}B" if n >= 1e9 else f"{n / 1e6:,.0f}M"
