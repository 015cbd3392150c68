"""`--verify`: every step of a parallel run is a step of single-process training, within rounding.

The run records (record.py) its full gradient of every step, as the optimizer was about to use it,
and every rank's sample of every parameter's elements before the first step and after each step.
The check walks the steps in order and names the first thing that differs beyond its bound:

1. initial parameters: every rank's sampled values equal the seeded initialization (bound: one
   rounding, u |theta|; a correct run copies them exactly);
2. per step k, the single-process evaluation at the replay's parameters, which are the run's
   (reference.AnchoredReference):
   loss      |L_run - L_ref| <= lambda (u_run + u_ref) sqrt(n_forward + tokens) mean_t(|lse_t| + |z_t|)
   gradient  per parameter, ||g_run - g_ref||_2 <= lambda (u_run + u_ref) sqrt(n_chain + tokens) ||T||_2,
             T the elementwise sum over the batch's tokens of |per-token gradient term|
             (reference.RoundingModel: Higham & Mary 2019's probabilistic bound, lambda = 10);
3. the replay takes the optimizer step with the run's own gradients; every rank's sampled values
   after step k (and the full parameters after the last step) must equal the replay's within the
   accumulated rounding of the updates, u sum_k (2 |theta| + 8 |delta theta_k|): a parameter's
   deviation is judged against the size of the updates it received, not against its own norm.

Anchoring every step at the run's own parameters keeps each comparison a pure rounding question
(reference.py explains why two free-running fp32 AdamW trajectories are not). A ratio error/bound
up to 1 passes; the output reports the largest ratio of each kind (the margin) and, on failure, the
first one above 1: which step, which tensor (and rank, for parameters), loss or gradient or parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from planner.executor.record import load_gradients, samples_by_rank, start_state
from planner.executor.reference import AnchoredReference

KINDS = ("initial parameters", "loss", "gradient", "parameters")


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    """One comparison: |run - reference| (a norm, for tensors) against its rounding bound."""

    step: int
    """Step it belongs to (-1: before the first step)."""
    kind: str
    """One of KINDS."""
    tensor: str
    """Parameter name ('' for the loss)."""
    error: float
    bound: float

    @property
    def ratio(self) -> float:
        if self.bound > 0:
            return self.error / self.bound
        return 0.0 if self.error == 0 else math.inf

    @property
    def failed(self) -> bool:
        return not self.ratio <= 1.0  # NaN fails too

    def describe(self) -> str:
        what = {
            "loss": "the loss",
            "gradient": f"the gradient of {self.tensor}",
            "parameters": f"parameter {self.tensor}",
            "initial parameters": f"initial parameter {self.tensor}",
        }[self.kind]
        when = (
            "before step 0"
            if self.step < 0
            else (
                f"after step {self.step}" if self.kind == "parameters" else f"at step {self.step}"
            )
        )
        ratio = "inf" if math.isinf(self.ratio) else f"{self.ratio:.3g}"
        return (
            f"{what} {when} differs from single-process training by {self.error:.3g} "
            f"({ratio} x its rounding bound {self.bound:.3g})"
        )

    def to_dict(self) -> dict:
        """Strict JSON: a non-finite number (a NaN gradient, a zero bound) becomes null."""
        return {
            "step": self.step,
            "kind": self.kind,
            "tensor": self.tensor,
            "error": _finite(self.error),
            "bound": _finite(self.bound),
            "ratio": _finite(self.ratio),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Verification:
    passed: bool
    first_failure: Check | None
    """The earliest check above its bound (order: initial, then per step loss, gradients, parameters)."""
    worst: dict
    """Kind -> the check with the largest error/bound ratio (the margin of that kind)."""
    steps: tuple[int, ...]
    """Steps verified (all, or those run after a resume)."""
    params_compared: int
    problems: tuple[str, ...] = ()
    """Missing or extra parameters, shape mismatches, missing records."""
    gradient_factor: float = 0.0
    """lambda (u_run + u_ref) sqrt(n_chain + tokens) of the gradient bound."""
    loss_factor: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def message(self) -> str:
        """The one-line reason of a failed verification."""
        if self.problems:
            return "verification failed: " + "; ".join(self.problems)
        return "verification failed: " + self.first_failure.describe()

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "steps": list(self.steps),
            "params_compared": self.params_compared,
            "first_failure": self.first_failure.to_dict() if self.first_failure else None,
            "worst": {k: c.to_dict() for k, c in self.worst.items()},
            "max_ratio": {k: _finite(c.ratio) for k, c in self.worst.items()},
            "problems": list(self.problems),
            "gradient_factor": self.gradient_factor,
            "loss_factor": self.loss_factor,
            "notes": list(self.notes),
        }


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t))


def _tensor_check(
    step: int,
    kind: str,
    name: str,
    got: torch.Tensor,
    want: torch.Tensor,
    bound: torch.Tensor | float,
) -> Check:
    return Check(
        step=step,
        kind=kind,
        tensor=name,
        error=_norm(got.float() - want.float()),
        bound=bound if isinstance(bound, float) else _norm(bound),
    )


def merged_params(ranks: list[dict]) -> dict[str, torch.Tensor]:
    """The full model from the per-stage parameter dicts the ranks gathered."""
    out: dict[str, torch.Tensor] = {}
    for r in ranks:
        out.update(r.get("params") or {})
    return out


class _Ledger:
    """Collects checks; remembers the first failure and the worst ratio of each kind."""

    def __init__(self):
        self.first: Check | None = None
        self.worst: dict[str, Check] = {}
        self.problems: list[str] = []

    def add(self, check: Check) -> None:
        if check.failed and self.first is None:
            self.first = check
        best = self.worst.get(check.kind)
        if best is None or check.ratio > best.ratio:
            self.worst[check.kind] = check


def compare_step(
    ledger: _Ledger, ref: AnchoredReference, step: int, loss_run: float | None, grads_run: dict
) -> None:
    """Loss and gradients of `step` at the replay's (= the run's) parameters."""
    expected = ref.gradient(step)
    if loss_run is not None:
        ledger.add(
            Check(
                step=step,
                kind="loss",
                tensor="",
                error=abs(loss_run - expected.loss),
                bound=expected.loss_bound,
            )
        )
    for name, want in expected.grads.items():
        got = grads_run.get(name)
        if got is None:
            ledger.problems.append(f"no gradient of {name} recorded at step {step}")
            continue
        if got.numel() != want.numel():
            ledger.problems.append(f"gradient of {name}: {tuple(got.shape)} vs {tuple(want.shape)}")
            continue
        ledger.add(
            _tensor_check(
                step, "gradient", name, got.reshape(want.shape), want, expected.grad_bounds[name]
            )
        )


def _sampled_checks(
    ledger: _Ledger, step: int, kind: str, ranks: list[dict], want: dict, bounds: dict
) -> None:
    """Every rank's sampled values after `step` against the replay (`want`, `bounds`: full tensors)."""
    seen = set()
    for rank, samples in samples_by_rank(ranks, step):
        for name, (idx, values) in samples.items():
            expected = want.get(name)
            if expected is None:
                continue
            seen.add(name)
            flat = expected.detach().reshape(-1)
            check = _tensor_check(
                step, kind, name, values, flat[idx], bounds[name].reshape(-1)[idx]
            )
            ledger.add(
                check
                if not check.failed
                else Check(
                    step=step,
                    kind=kind,
                    tensor=f"{name} (rank {rank})",
                    error=check.error,
                    bound=check.bound,
                )
            )
    for name in sorted(set(want) - seen):
        ledger.problems.append(f"no rank recorded values of {name} ({kind}, step {step})")


def verify_run(spec, ranks: list[dict], workdir=None, *, reference_model=None) -> Verification:
    """Check the run recorded in `ranks` (and `workdir`'s gradient files) step by step against one process."""
    ref = AnchoredReference(spec, model=reference_model)
    ledger = _Ledger()
    notes = []
    if ref.rounding.gradient_factor >= 0.1:
        notes.append(
            f"the rounding bound of {spec.dtype} arithmetic is {ref.rounding.gradient_factor:.2g} x the "
            f"summed |gradient terms|: at this depth it is no smaller than the gradients, so gradient "
            f"differences cannot be detected (run in fp32 to verify)"
        )
    start = ranks[0].get("start_step", 0)
    losses = ranks[0]["losses"]
    u = ref.rounding.u_run + ref.rounding.u_ref
    if start:
        state = start_state(ranks)
        if not state:
            ledger.problems.append(f"the resumed run recorded no starting state (step {start})")
            return _verdict(spec, ref, ledger, start, 0, notes)
        ref.load_state(state["params"], state["state"])
        notes.append(
            f"resumed at step {start}: steps {start}..{spec.steps - 1} verified, from the checkpoint's "
            f"parameters and optimizer state"
        )
    else:
        _sampled_checks(
            ledger,
            -1,
            "initial parameters",
            ranks,
            ref.params,
            {n: u * p.detach().abs() for n, p in ref.params.items()},
        )
    for step in range(start, spec.steps):
        grads = load_gradients(step, ranks, workdir)
        if not grads:
            ledger.problems.append(f"no gradients recorded for step {step}")
            break
        compare_step(ledger, ref, step, losses[step] if step < len(losses) else None, grads)
        bounds = ref.apply(grads)
        del grads
        _sampled_checks(ledger, step, "parameters", ranks, ref.params, bounds)
    final = merged_params(ranks)
    missing = sorted(set(ref.params) - set(final))
    extra = sorted(set(final) - set(ref.params))
    if missing:
        ledger.problems.append(f"missing parameters: {', '.join(missing[:5])}")
    if extra:
        ledger.problems.append(f"unexpected parameters: {', '.join(extra[:5])}")
    if ref.bounds is not None:
        for name, p in ref.params.items():
            got = final.get(name)
            if got is None:
                continue
            if got.shape != p.shape:
                ledger.problems.append(f"{name}: shape {tuple(got.shape)} vs {tuple(p.shape)}")
                continue
            ledger.add(
                _tensor_check(spec.steps - 1, "parameters", name, got, p.detach(), ref.bounds[name])
            )
    return _verdict(spec, ref, ledger, start, len(set(final) & set(ref.params)), notes)


def _verdict(spec, ref, ledger: _Ledger, start: int, compared: int, notes: list) -> Verification:
    passed = ledger.first is None and not ledger.problems
    return Verification(
        passed=passed,
        first_failure=ledger.first,
        worst=dict(ledger.worst),
        steps=tuple(range(start, spec.steps)),
        params_compared=compared,
        problems=tuple(ledger.problems),
        gradient_factor=ref.rounding.gradient_factor,
        loss_factor=ref.rounding.loss_factor,
        notes=tuple(notes),
    )
