"""Least-squares fits of a hardware profile's `efficiency` keys to measured step times: the fit that
benchmarks/calibrate.py runs on the single-H100 training steps and benchmarks/accuracy_published.py
on the published A100 runs (with its leave-one-out)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy.optimize import least_squares


def with_eff(hw, values: dict):
    """`hw` with `values` over its efficiency block."""
    return dataclasses.replace(hw, efficiency={**hw.efficiency, **values})


def fit_keys(keys: dict, hw, rows, predict_s, measured_s, x0=None) -> dict:
    """The values of `keys` ({key: (low, high)}) that best fit log(predict_s(row, hw) /
    measured_s(row)) over `rows` (least squares within the bounds), from `x0` or `hw`'s own values."""
    names = list(keys)
    lo = [keys[k][0] for k in names]
    hi = [keys[k][1] for k in names]
    x0 = x0 or [
        min(max(float(hw.efficiency.get(k, (a + b) / 2)), a + 1e-6), b - 1e-6)
        for k, (a, b) in keys.items()
    ]

    def resid(x):
        h = with_eff(hw, dict(zip(names, x)))
        return np.array([math.log(predict_s(r, h) / measured_s(r)) for r in rows])

    sol = least_squares(resid, x0, bounds=(lo, hi), diff_step=1e-3)
    return dict(zip(names, map(float, sol.x)))
