"""Compare a parallel run with the single-process reference: the loss of every step and every parameter.

Relative error of a tensor is ||a - b|| / ||b|| (Frobenius), so parameters that start at zero
(biases) are judged against their tensor's scale, not elementwise; a loss's is |a - b| / |b|.
With AdamW, elements whose gradient came within 100 eps of zero (reference.EPS_SENSITIVE_FACTOR)
and whole parameters with a zero gradient are held to an absolute bound instead, 2 lr per step:
Adam's normalized update turns their rounding noise into moves of up to lr.
fp32 tolerance: 1e-5 (the issue's bar); the run differs from the reference only in the order of
floating-point sums (micro-batches, shards, all-reduces).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from planner.executor.reference import ReferenceResult

FP32_RTOL = 1e-5


@dataclass(frozen=True, kw_only=True, slots=True)
class Verification:
    passed: bool
    rtol: float
    loss_max_rel_err: float
    """Largest relative loss error over the steps."""
    param_max_rel_err: float
    """Largest relative (Frobenius) error over the parameters after the last step."""
    worst_param: str
    params_compared: int
    problems: tuple[str, ...] = ()
    """Missing or extra parameters, shape mismatches, zero-gradient parameters out of bound."""
    zero_grad_params: tuple[str, ...] = ()
    """Parameters with a zero reference gradient, checked to max |a - b| <= 2 * lr * steps instead."""
    eps_sensitive_elements: int = 0
    """AdamW: elements whose gradient came within 100 eps of zero (bounded absolutely, see module)."""

    def hint(self) -> str:
        """Why a failing AdamW comparison may still be a correct run, and how to tell."""
        if self.passed or not self.eps_sensitive_elements:
            return ""
        return (f"{self.eps_sensitive_elements} gradient element(s) came within 100 eps of zero, where AdamW's "
                f"normalized update turns rounding into moves of up to lr that later steps carry into every "
                f"parameter; check the parallel sums with --steps 1, or with a plan whose optimizer is sgd")

    def to_dict(self) -> dict:
        return {"passed": self.passed, "rtol": self.rtol, "loss_max_rel_err": self.loss_max_rel_err,
                "param_max_rel_err": self.param_max_rel_err, "worst_param": self.worst_param,
                "params_compared": self.params_compared, "problems": list(self.problems),
                "zero_grad_params": list(self.zero_grad_params),
                "eps_sensitive_elements": self.eps_sensitive_elements, "hint": self.hint()}


def merged_params(ranks: list[dict]) -> dict[str, torch.Tensor]:
    """The full model from the per-stage parameter dicts the ranks gathered."""
    out: dict[str, torch.Tensor] = {}
    for r in ranks:
        out.update(r.get("params") or {})
    return out


def compare(losses: list[float], params: dict[str, torch.Tensor], reference: ReferenceResult,
            *, rtol: float = FP32_RTOL, max_move: float = 0.0) -> Verification:
    """`max_move`: bound on a zero-gradient parameter's drift (2 * lr * steps for AdamW, whose
    normalized update moves any parameter by at most about lr per step)."""
    problems = []
    if len(losses) != len(reference.losses):
        problems.append(f"{len(losses)} losses vs the reference's {len(reference.losses)}")
    loss_err = max((abs(a - b) / abs(b) for a, b in zip(losses, reference.losses)), default=0.0)
    missing = sorted(set(reference.params) - set(params))
    extra = sorted(set(params) - set(reference.params))
    if missing:
        problems.append(f"missing parameters: {', '.join(missing[:5])}")
    if extra:
        problems.append(f"unexpected parameters: {', '.join(extra[:5])}")
    worst, worst_err = "", 0.0
    for name, ref in reference.params.items():
        if name not in params:
            continue
        got = params[name]
        if got.shape != ref.shape:
            problems.append(f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}")
            continue
        if name in reference.zero_grad_params:
            drift = (got - ref).abs().max().item()
            if drift > max_move:
                problems.append(f"{name}: zero-gradient parameter drifted {drift:.2e} > {max_move:.2e}")
            continue
        diff = got - ref
        mask = reference.eps_sensitive.get(name)
        if mask is not None and mask.shape == diff.shape:
            drift = diff[mask].abs().max().item()
            if drift > max_move:
                problems.append(f"{name}: {int(mask.sum())} element(s) with |grad| near Adam's eps drifted "
                                f"{drift:.2e} > {max_move:.2e}")
            diff = diff.masked_fill(mask, 0.0)
        err = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
        if err > worst_err:
            worst, worst_err = name, err
    passed = not problems and loss_err <= rtol and worst_err <= rtol
    return Verification(passed=passed, rtol=rtol, loss_max_rel_err=loss_err, param_max_rel_err=worst_err,
                        worst_param=worst, params_compared=len(set(params) & set(reference.params)),
                        problems=tuple(problems), zero_grad_params=reference.zero_grad_params,
                        eps_sensitive_elements=int(sum(int(m.sum()) for m in reference.eps_sensitive.values())))


def verify_run(spec, ranks: list[dict], reference: ReferenceResult | None = None) -> Verification:
    """Run the single-process reference for `spec` (unless given) and compare rank 0's gathered run."""
    from planner.executor.reference import run_reference

    reference = reference or run_reference(spec)
    lr = spec.lr * (10 if spec.config.optimizer == "sgd" else 1)
    return compare(ranks[0]["losses"], merged_params(ranks), reference, max_move=2 * lr * spec.steps)
