"""Explain a plan: where the step time and the memory go, and why the runners-up lost.

Works on plan documents (and on the key numbers `recommend` stores under "alternatives"), so it
explains a plan file without re-running the search, and compares any two predictions (what
benchmarks/published_search.py prints when a published configuration loses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from planner.run_options import RunOptions, grad_reduce_dtype_of
from frameworks import load_framework
from planner.partition import even_split
from planner.plan import run_options
from planner.search import key_numbers, recommend

GiB = 2**30
MEMORY_TERMS = (
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "other_bytes",
)
CONFIG_KEYS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "cp_comm",
    "ep",
    "expert_tp",
    "dp_shard",
    "micro_batch",
    "num_microbatches",
    "schedule",
    "virtual_stages",
    "zero",
    "recompute",
    "recompute_layers",
    "offload",
    "sequence_parallel",
    "placement",
    "stages",
)
CONFIG_DEFAULTS = {"ep": 1, "expert_tp": 1, "recompute_layers": None}
"""Values a plan written before a key existed has (no expert parallelism), or that it leaves out (recompute_layers:
every block)."""


TIME_TERMS = {
    "compute": "the blocks' and head's forward and backward kernels on the device, recomputation "
    "included",
    "recompute_part_of_compute": "the part of compute spent re-running activations for the "
    "backward (already inside compute; not added again)",
    "tp_comm": "exposed tensor-parallel collectives (all-reduce, or all-gather + reduce-scatter "
    "with sequence parallelism)",
    "cp_comm": "exposed context-parallel key/value exchange (ring, all-gather or all-to-all)",
    "ep_comm": "exposed expert-parallel dispatch and combine (all-to-all of the routed tokens)",
    "dp_comm": "exposed data-parallel gradient reduction and ZeRO parameter gathers",
    "pp_p2p": "exposed pipeline sends and receives between stages",
    "bubble": "pipeline stages idle at the start and end of each step (schedule dependent)",
    "optimizer": "the optimizer step streaming parameters, gradients and states, with its "
    "launches, the gradient norm and the loss all-reduce",
    "offload": "exposed host-device copies of offloaded optimizer states or activations",
    "host_wait": "time the device waits for the host to issue kernels (eager PyTorch's per-op "
    "launch cost, and the host synchronizations of dropless MoE routing): the host "
    "is the bottleneck",
}
"""What each term of prediction.time_breakdown_s measures (docs/cost-model.md, 'Step-time
terms')."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    """The three parts of `planner explain`, as lines of text and as data."""

    headline: str
    time_lines: tuple[str, ...]
    memory_lines: tuple[str, ...]
    versus_lines: tuple[str, ...]
    data: Mapping[str, Any] = field(default_factory=dict)
    expert_lines: tuple[str, ...] = ()
    """Where the experts sit and what their exchanges cost (mixture-of-experts plans; expert_lines)."""
    term_lines: tuple[str, ...] = ()
    """What each time term shown measures (term_lines)."""
    versus_title: str = "Why this plan won:"
    """The title of the comparison: a plan that some compared plan beats did not win
    (versus_title)."""

    def text(self) -> str:
        parts = [
            self.headline,
            "",
            "Where the step time goes:",
            *self.time_lines,
            *self.term_lines,
            "",
            "Where the memory goes (per GPU, at the peak rank):",
            *self.memory_lines,
            "",
        ]
        if self.expert_lines:
            parts += ["Expert parallelism:", *self.expert_lines, ""]
        parts += [self.versus_title, *self.versus_lines]
        return "\n".join(parts)


def _even(blocks: int, chunks: int):
    return even_split(blocks, chunks)


def describe_config(plan: Mapping[str, Any]) -> str:
    """One-line summary of a plan's parallel configuration."""
    sched = plan["schedule"] + (
        f"(v={plan['virtual_stages']})" if plan.get("virtual_stages", 1) > 1 else ""
    )
    text = f"dp={plan['dp']} tp={plan['tp']} pp={plan['pp']}"
    if plan.get("cp", 1) > 1:
        text += f" cp={plan['cp']}({plan.get('cp_comm', 'p2p')})"
    if plan.get("ep", 1) > 1 or plan.get("expert_tp", 1) > 1:
        text += f" ep={plan.get('ep', 1)} expert_tp={plan.get('expert_tp', 1)}"
    text += (
        f" mb={plan['micro_batch']} x{plan.get('num_microbatches', '?')} {sched} zero={plan['zero']}"
        f" recompute={plan['recompute']}"
    )
    if plan.get("recompute_layers") is not None:
        text += f"({plan['recompute_layers']}/chunk)"
    if plan.get("dp_shard", 0) and plan["dp_shard"] != plan["dp"] and plan.get("zero", 0) >= 1:
        text += f" dp_shard={plan['dp_shard']}"
    if plan.get("offload", "none") != "none":
        text += f" offload={plan['offload']}"
    if plan.get("sequence_parallel"):
        text += " sp"
    text += f" {plan['placement']}"
    stages = plan.get("stages")
    if stages and tuple(stages) != tuple(_even(sum(stages), len(stages))):
        text += f" stages={list(stages)}" if len(stages) <= 16 else " stages=uneven"
    return text


def _numbers(doc: Mapping[str, Any]) -> dict:
    """Normalize a plan document or an alternatives entry to plan/step/memory/breakdown."""
    if "prediction" in doc:
        pred = doc["prediction"]
        return {
            "plan": doc["plan"],
            "step_time_s": pred["step_time_s"],
            "memory": pred["memory"],
            "time_breakdown_s": pred["time_breakdown_s"],
            "mfu": pred.get("mfu"),
        }
    return {
        "plan": doc["plan"],
        "step_time_s": doc["step_time_s"],
        "memory": doc.get(
            "memory", {"peak_bytes_per_gpu": doc["peak_bytes_per_gpu"], "fits": doc["fits"]}
        ),
        "time_breakdown_s": doc.get("time_breakdown_s", {}),
        "mfu": doc.get("mfu"),
    }


def time_lines(doc: Mapping[str, Any]) -> list[str]:
    """Each time term with its share of the step, largest first."""
    n = _numbers(doc)
    step = n["step_time_s"]
    terms = sorted(n["time_breakdown_s"].items(), key=lambda kv: -abs(kv[1]))
    lines = [f"  {name:<16} {seconds:10.3f} s  {seconds / step:6.1%}" for name, seconds in terms]
    total = sum(v for k, v in n["time_breakdown_s"].items() if "part_of" not in k)
    if abs(total - step) > 1e-6 * max(step, 1e-12):
        lines.append(
            f"  (terms sum to {total:.3f} s; the step is {step:.3f} s because communication overlaps "
            "computation where the schedule allows)"
        )
    return lines


def term_lines(doc: Mapping[str, Any], width: int = 100) -> list[str]:
    """'What the terms measure:' and one wrapped entry per term of the plan's breakdown
    (TIME_TERMS)."""
    import textwrap

    names = [n for n in _numbers(doc)["time_breakdown_s"] if n in TIME_TERMS]
    lines = ["  What the terms measure:"] if names else []
    for name in names:
        lines += textwrap.wrap(
            f"{name}: {TIME_TERMS[name]}",
            width=width,
            initial_indent="    ",
            subsequent_indent="      ",
        )
    return lines


def memory_lines(doc: Mapping[str, Any]) -> list[str]:
    """Each memory term with its share of the peak, and the headroom to the capacity."""
    mem = _numbers(doc)["memory"]
    peak, cap = mem["peak_bytes_per_gpu"], mem.get("capacity_bytes")
    lines = [
        f"  {name.removesuffix('_bytes'):<16} {mem[name] / GiB:10.2f} GiB  {mem[name] / max(peak, 1):6.1%}"
        for name in MEMORY_TERMS
        if name in mem
    ]
    if cap:
        # the plan's own verdict (cost_models.memory.fits: the peak with the allocator's overhead and the
        # CUDA context), never recomputed here
        verdict = "fits" if mem.get("fits", peak <= cap) else "does NOT fit"
        needed = mem.get("needed_bytes")
        margin = (
            f", needs {needed / GiB:.2f} GiB with allocator overhead and CUDA context, margin "
            f"{(cap - needed) / GiB:+.2f} GiB"
            if needed is not None
            else f", headroom {(cap - peak) / GiB:+.2f} GiB"
        )
        lines.append(f"  peak {peak / GiB:.2f} GiB of {cap / GiB:.2f} GiB ({verdict}{margin})")
    return lines


def expert_lines(doc: Mapping[str, Any]) -> list[str]:
    """The expert layout of a mixture-of-experts plan (prediction.expert_parallel, written by
    planner.estimate from cost_models.moe.placement_summary): the groups, the links the all-to-all uses,
    the dispatcher, one dispatch's bytes and time, and the step's exchange time exposed vs overlapped."""
    ep = (doc.get("prediction") or {}).get("expert_parallel")
    if not ep:
        return []
    lines = [
        f"  ep={ep['ep']} expert_tp={ep['expert_tp']} expert_dp={ep['expert_dp']}: {ep['local_experts']:g} "
        f"experts per GPU, {ep['rows_per_local_expert']:,.0f} tokens per expert per micro-batch"
        + (f" (busiest rank, imbalance {ep['imbalance']:g})" if ep["imbalance"] > 1 else "")
    ]
    if ep["ep"] == 1:
        lines.append(
            f"  no expert parallelism: every GPU holds every expert ({ep['dispatcher']} dispatcher)"
        )
        return lines
    span = (
        f"{ep['ep']} ranks inside one NVLink domain"
        if ep["links"] == "NVLink"
        else f"{ep['ep_ranks_per_nvlink_domain']} ranks per NVLink domain over {ep['ep_nvlink_domains']} domains"
    )
    lines.append(
        f"  all-to-all over {span}: {ep['links']}; dispatcher {ep['dispatcher']}"
        + (
            f", {ep['remote_domains_per_token']:.2f} remote domains per token"
            if ep.get("remote_domains_per_token") is not None
            else ""
        )
    )
    lines.append(
        f"  one dispatch {ep['dispatch_bytes_per_rank'] / 2**20:,.1f} MiB per GPU in "
        f"{ep['dispatch_s'] * 1e3:.2f} ms, one combine {ep['combine_s'] * 1e3:.2f} ms "
        "(forward; the backward repeats both)"
    )
    total, exposed, hidden = (
        ep["exchange_total_s"],
        ep["exchange_exposed_s"],
        ep["exchange_hidden_s"],
    )
    how = (
        "overlapped with the other micro-batch's expert and attention compute"
        if ep["overlap"]
        else "not overlapped (on the critical path)"
    )
    lines.append(
        f"  exchanges {total:.3f} s per step: {exposed:.3f} s exposed, {hidden:.3f} s hidden; {how}"
    )
    return lines


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Knobs whose values differ between two plans, as 'key a->b'."""

    def show(key, value):
        if key == "stages" and value:
            return "even" if tuple(value) == tuple(_even(sum(value), len(value))) else "uneven"
        return value

    out = []
    for k in CONFIG_KEYS:
        va, vb = a.get(k, CONFIG_DEFAULTS.get(k)), b.get(k, CONFIG_DEFAULTS.get(k))
        if va != vb and show(k, va) != show(k, vb):
            out.append(f"{k} {show(k, va)}->{show(k, vb)}")
    return out


def compare(
    winner: Mapping[str, Any], other: Mapping[str, Any], *, label: str = "runner-up"
) -> list[str]:
    """Why `other` loses to `winner`: its step-time gap split by term, and its memory."""
    w, o = _numbers(winner), _numbers(other)
    gap = o["step_time_s"] - w["step_time_s"]
    lines = [f"  {label}: {describe_config(o['plan'])}"]
    diffs = config_differences(w["plan"], o["plan"])
    if diffs:
        lines.append("    differs in " + ", ".join(diffs))
    rel = gap / w["step_time_s"] if w["step_time_s"] else 0.0
    lines.append(
        f"    step {o['step_time_s']:.3f} s vs {w['step_time_s']:.3f} s "
        f"({'slower' if gap > 0 else 'faster' if gap < 0 else 'equal'} by {abs(rel):.1%})"
    )
    terms = set(w["time_breakdown_s"]) | set(o["time_breakdown_s"])
    deltas = sorted(
        ((t, o["time_breakdown_s"].get(t, 0.0) - w["time_breakdown_s"].get(t, 0.0)) for t in terms),
        key=lambda kv: -abs(kv[1]),
    )
    moved = [f"{t} {d:+.3f} s" for t, d in deltas[:4] if abs(d) > 1e-9]
    if moved:
        lines.append("    time terms: " + ", ".join(moved))
    wm, om = w["memory"], o["memory"]
    mem_line = f"    peak memory {om['peak_bytes_per_gpu'] / GiB:.2f} GiB vs {wm['peak_bytes_per_gpu'] / GiB:.2f} GiB"
    if not om.get("fits", True):
        mem_line += " (does not fit)"
    lines.append(mem_line)
    return lines


def _values(name: str, values: list) -> str:
    shown = ", ".join(map(str, values))
    return f"{name} {shown} ({len(values)} value{'s' if len(values) != 1 else ''})"


def search_lines(doc: Mapping[str, Any]) -> list[str]:
    """What the search tried beyond dp x tp x pp (its `values_tried`: cp, cp_comm, dp_shard, ep), why the
    chosen context-parallel degree won: the plan compared with the best plan of the other cp class (cp = 1
    when the winner has cp > 1), which the search stores as `cp_versus` (planner.search.documents._cp_versus), and for a
    mixture-of-experts plan why its expert-parallel degree and placement won (`ep_lines`)."""
    search = doc.get("search") or {}
    tried = search.get("values_tried") or {}
    lines = []
    if tried:
        parts = [
            _values(name, tried[name])
            for name in ("cp", "cp_comm", "dp_shard", "ep")
            if name in tried
        ]
        lines.append("  tried " + "; ".join(parts) + " (dp_shard 0: shard over all dp ranks)")
    return lines + _cp_lines(doc) + ep_lines(doc)


def _cp_lines(doc: Mapping[str, Any]) -> list[str]:
    """Why the plan's context-parallel degree (search_lines): the best plan of the other cp class."""
    versus = (doc.get("search") or {}).get("cp_versus")
    if not versus:
        return []
    lines = []
    plan = doc["plan"]
    cp = plan.get("cp", 1)
    if "plan" not in versus:
        other = "cp = 1" if cp > 1 else "cp > 1"
        lines.append(
            f"  cp={cp} because no plan with {other} fits: the leanest needs "
            f"{versus['needed_bytes'] / GiB:.2f} GiB of {versus['capacity_bytes'] / GiB:.2f} GiB"
        )
        return lines
    label = "best plan at cp=1" if cp > 1 else "best plan with cp > 1"
    w, o = _numbers(doc), _numbers(versus)
    gap = o["step_time_s"] / w["step_time_s"] - 1 if w["step_time_s"] else 0.0
    peak_o, peak_w = (
        o["memory"]["peak_bytes_per_gpu"] / GiB,
        w["memory"]["peak_bytes_per_gpu"] / GiB,
    )
    head = f"cp={cp}" + (f" ({plan.get('cp_comm', 'p2p')})" if cp > 1 else "")
    tie = (doc.get("search") or {}).get("near_ties")
    if gap >= 0:
        head = f"why {head}: the {label} takes"
    elif tie and -gap < tie["mape"]:  # ranked first among near-ties (planner.uncertainty)
        head = (
            f"why {head}: the {label} is within the model's measured error of it "
            f"(+-{tie['mape']:.1%}), a near-tie, and recommend ranks near-ties by fewest axes, "
            "then least memory; it takes"
        )
    else:
        head = f"{head} loses to the {label}, which takes"
    lines.append(
        f"  {head} {o['step_time_s']:.3f} s per step ({gap:+.1%}) and {peak_o:.2f} GiB per GPU "
        f"(this plan {w['step_time_s']:.3f} s, {peak_w:.2f} GiB)"
    )
    lines += ["  " + line for line in compare(doc, versus, label=label)]
    return lines


def _ep_class(plan: Mapping[str, Any], ep: Mapping[str, Any]) -> tuple[int, str]:
    return int(plan.get("ep", CONFIG_DEFAULTS["ep"])), ep.get("links", "none")


def _links_text(ep: Mapping[str, Any], network: str) -> str:
    """Where an expert-parallel group's all-to-all runs, in words (cost_models.moe.EP_LINKS)."""
    if ep.get("links", "none") == "none":
        return "no all-to-all (every GPU holds every expert)"
    if ep["links"] == "NVLink":
        return f"all-to-all inside one NVLink domain ({ep['ep']} ranks)"
    per = ep["ep_ranks_per_nvlink_domain"]
    return (
        f"all-to-all over NVLink + {network} ({per} rank{'s' if per != 1 else ''} per NVLink domain, "
        f"{ep['ep_nvlink_domains']} domains)"
    )


def ep_lines(doc: Mapping[str, Any]) -> list[str]:
    """Why the plan's expert-parallel degree and placement: against the best plan of each other expert-parallel
    class the search found (`ep_versus`, planner.search.documents._ep_versus: an ep degree and whether its all-to-all stays
    inside one NVLink domain or crosses the network), the step-time gap, the terms that differ most (always the
    exposed all-to-all, ep_comm), the experts and routed-expert parameters per GPU, the peak memory, and the
    routing imbalance where it differs. A class whose best was not refined is as the search scored it (even
    stages); where some class's best is only the fastest the search scored, the least step time its unscored
    plans could have."""
    versus = (doc.get("search") or {}).get("ep_versus")
    mine_ep = (doc.get("prediction") or {}).get("expert_parallel")
    if not versus or not mine_ep:
        return []
    network, plan = versus.get("network", "network"), doc["plan"]
    mine = _ep_class(plan, mine_ep)
    others = [c for c in versus["classes"] if _ep_class(c["plan"], c["expert_parallel"]) != mine]
    if not others:
        return []
    w = _numbers(doc)
    beaten = sum(
        c["step_time_s"] < w["step_time_s"] and c["memory"].get("fits", True) for c in others
    )
    this = (
        f"ep={mine[0]} with {_links_text(mine_ep, network)}: {w['step_time_s']:.3f} s, "
        f"{_experts(mine_ep)} per GPU"
    )
    head = (
        f"{this} -- loses to {beaten} other expert-parallel class{'es' if beaten != 1 else ''}"
        if beaten
        else f"why {this}"
    )
    lines = [f"  {head}; the best plan of each other expert-parallel degree and placement:"]
    for c in others:
        lines += _ep_class_lines(c, w, mine_ep, network)
    floors = [
        c["unscored_at_least_s"]
        for c in others
        if not c.get("exact", True) and c.get("unscored_at_least_s")
    ]
    if floors:
        lines.append(
            f"    (classes marked * show the fastest plan the search scored; the plans it did not score "
            f"take at least {min(floors):.3f} s)"
        )
    return lines


def _experts(ep: Mapping[str, Any]) -> str:
    n = ep.get("local_experts", 0)
    return (
        f"{n:g} expert{'s' if n != 1 else ''} and {ep.get('expert_params_per_gpu', 0) / 1e9:.2f} B "
        "routed-expert parameters (before ZeRO sharding)"
    )


def _ep_class_lines(
    c: Mapping[str, Any], w: Mapping[str, Any], mine_ep: Mapping[str, Any], network: str
) -> list[str]:
    """Two lines for one expert-parallel class of `ep_lines`: its step against this plan's with the terms that
    differ most, then its experts, memory and degrees."""
    o, ep = _numbers(c), c["expert_parallel"]
    gap = o["step_time_s"] / w["step_time_s"] - 1 if w["step_time_s"] else 0.0
    deltas = {
        t: o["time_breakdown_s"].get(t, 0.0) - w["time_breakdown_s"].get(t, 0.0)
        for t in set(w["time_breakdown_s"]) | set(o["time_breakdown_s"])
        if "part_of" not in t
    }
    top = [
        t
        for t, d in sorted(deltas.items(), key=lambda kv: -abs(kv[1]))
        if t != "ep_comm" and abs(d) > 1e-9
    ][:2]
    terms = ", ".join(f"{t} {deltas[t]:+.3f} s" for t in ["ep_comm"] + top)
    mark = "*" if not c.get("exact", True) else ""
    note = " (even stages, as scored)" if c.get("as_scored") else ""
    first = f"    ep={ep['ep']}{mark}, {_links_text(ep, network)}: {o['step_time_s']:.3f} s ({gap:+.1%}){note}: {terms}"
    p = c["plan"]
    degrees = (
        f"dp={p['dp']} tp={p['tp']} pp={p['pp']}"
        + (f" cp={p['cp']}" if p.get("cp", 1) > 1 else "")
        + f" {p['placement']}"
    )
    fits = "" if o["memory"].get("fits", True) else " (does not fit)"
    second = (
        f"      {_experts(ep)} per GPU, peak {o['memory']['peak_bytes_per_gpu'] / GiB:.1f} GiB{fits} vs "
        f"{w['memory']['peak_bytes_per_gpu'] / GiB:.1f} GiB"
    )
    if ep.get("imbalance", 1.0) != mine_ep.get("imbalance", 1.0):
        second += f", routing imbalance {ep['imbalance']:g} vs {mine_ep['imbalance']:g}"
    return [first, second + f"; {degrees}"]


def versus_title(doc: Mapping[str, Any]) -> str:
    """ "Why this plan won:" only when no compared plan that fits is faster; else how many beat
    it."""
    mine = _numbers(doc)["step_time_s"]
    faster = [
        a
        for a in doc.get("alternatives", [])
        if _numbers(a)["memory"].get("fits", True) and _numbers(a)["step_time_s"] < mine
    ]
    if not faster:
        return "Why this plan won:"
    best = min(_numbers(a)["step_time_s"] for a in faster)
    verb = "is" if len(faster) == 1 else "are"
    return (
        f"This plan did not win: {len(faster)} of the compared plans {verb} "
        f"faster (the best by {1 - best / mine:.0%} of the step):"
    )


def explain_document(doc: Mapping[str, Any]) -> Explanation:
    """Explain a plan document (its stored alternatives, if any, are the runners-up)."""
    n = _numbers(doc)
    model, hw = doc.get("model", {}), doc.get("hardware", {})
    pred = doc["prediction"]
    headline = (
        f"{model.get('name', '?')} on {hw.get('gpus', '?')} x {hw.get('name', '?')}: "
        f"{describe_config(n['plan'])}\n"
        f"predicted {n['step_time_s']:.3f} s/step, {pred.get('tokens_per_s', 0):,.0f} tokens/s, "
        f"{pred.get('tflops_per_gpu', 0):.1f} TFLOP/s per GPU (MFU {pred.get('mfu', 0):.1%})"
    )
    if "cost" in pred:
        headline += (
            f"\ncost ${pred['cost']['usd_per_hour']:,.2f}/h, ${pred['cost']['usd_per_step']:.4f}/step, "
            f"${pred['cost']['usd_per_1b_tokens']:,.2f} per 1B tokens"
        )
    alternatives = doc.get("alternatives", [])
    if alternatives:
        versus = []
        for i, alt in enumerate(alternatives[:3]):
            versus += compare(doc, alt, label=f"#{i + 2}")
        search = doc.get("search")
        if search:
            versus.append(
                f"  (searched {search.get('candidates_evaluated', '?'):,} candidates, "
                f"{search.get('feasible', '?'):,} fit, in {search.get('seconds', 0):.2f} s, "
                f"objective {search.get('objective', 'throughput')})"
            )
            versus += search_lines(doc)
    else:
        versus = [
            "  no runners-up stored in this plan (written by `estimate`); `planner explain --search` "
            "re-runs the search and compares"
        ]
    data = {
        "step_time_s": n["step_time_s"],
        "time_breakdown_s": dict(n["time_breakdown_s"]),
        "memory": dict(n["memory"]),
        "expert_parallel": dict(pred.get("expert_parallel") or {}),
        "alternatives": [
            {
                "plan": _numbers(a)["plan"],
                "step_time_s": _numbers(a)["step_time_s"],
                "slower_by": _numbers(a)["step_time_s"] / n["step_time_s"] - 1,
            }
            for a in alternatives
        ],
    }
    return Explanation(
        headline=headline,
        time_lines=tuple(time_lines(doc)),
        memory_lines=tuple(memory_lines(doc)),
        versus_lines=tuple(versus),
        data=data,
        expert_lines=tuple(expert_lines(doc)),
        versus_title=versus_title(doc),
        term_lines=tuple(term_lines(doc)),
    )


def _software_options(doc: Mapping[str, Any]) -> RunOptions:
    """The kernel choices the plan was costed with (its `software` block), for a comparable search on the same
    stack: the run's own options (planner.plan.run_options, the MoE ones included) and the framework choices it
    may override (attention, dropout, overlap, reduction dtype, allocator, modules); an overlap the search chose
    per plan (`search.overlaps.free`) left unset."""
    sw = doc.get("software") or {}
    out = {
        k: sw[k]
        for k in (
            "attention",
            "dropout",
            "overlap_grad_reduce",
            "tp_comm_overlap",
            "overlap_param_gather",
            "overlap_p2p",
        )
        if k in sw
    }
    if grad_reduce_dtype_of(sw.get("grad_reduce_bytes")) is not None:
        out["grad_reduce_dtype"] = grad_reduce_dtype_of(sw["grad_reduce_bytes"])
    if isinstance(sw.get("expandable_segments"), bool):
        out["expandable_segments"] = sw["expandable_segments"]
    if sw.get("framework"):
        if sw.get("kernels") and sw["kernels"] != load_framework(sw["framework"]).kernels:
            out["kernels"] = sw[
                "kernels"
            ]  # a run that swaps in another stack's modules (--kernels)
    # an overlap the search chose per plan stays the fresh search's choice (planner.search.overlaps)
    free = ((doc.get("search") or {}).get("overlaps") or {}).get("free") or ()
    return run_options(doc).with_(**(out | {name: None for name in free}))


def research(doc: Mapping[str, Any], *, top: int = 4) -> dict:
    """The plan document with `alternatives` replaced by a fresh search on the same model, hardware,
    world size, batch, sequence and precision. If the search finds a faster plan than the document's,
    it is listed first (with a negative gap), which is how `explain` says what beats a given plan."""
    plan = doc["plan"]
    rec = recommend(
        doc["model"]["name"],
        doc["hardware"]["name"],
        gpus=doc["hardware"]["gpus"],
        global_batch=plan["global_batch"],
        seq=plan["seq"],
        precision=plan["precision"],
        optimizer=plan.get("optimizer", "adamw"),
        top=top,
        framework=plan.get("framework", "megatron"),
        options=_software_options(doc),
    )
    found = [rec.best] + list(rec.alternatives)
    same = lambda a: all(
        a["plan"].get(k, CONFIG_DEFAULTS.get(k)) == plan.get(k, CONFIG_DEFAULTS.get(k))  # noqa: E731
        for k in CONFIG_KEYS
    )
    out = dict(doc)
    out["alternatives"] = [key_numbers(d) for d in found if not same(d)][:top]
    search = dict(rec.best["search"])
    if search.get("cp_versus") is not None and (rec.best["plan"].get("cp", 1) > 1) != (
        plan.get("cp", 1) > 1
    ):
        search["cp_versus"] = key_numbers(
            rec.best
        )  # the other cp class's best, seen from this plan
    out["search"] = search
    return out
