"""The cross-check: exact values at high precision against the NumPy reference.

The two are zipped by stage id; every entry is compared and the largest
difference of each stage reported. A −∞ must meet a −∞ in the same place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath

from .derivation import Derivation
from .numeric import numeric_stages

TOLERANCE = 1e-9  # relative to max(1, |value|): float64 at these sizes is far better
PRECISION = 30  # digits of the exact values' evaluation


@dataclass(frozen=True)
class Mismatch:
    stage: str
    row: int
    col: int
    exact: float
    numeric: float

    def __str__(self) -> str:
        return (
            f"{self.stage}[{self.row}][{self.col}]: exact value {self.exact!r} "
            f"but NumPy gives {self.numeric!r}"
        )


@dataclass(frozen=True)
class CrossCheck:
    """The outcome of comparing every stage with the NumPy float64 reference."""

    per_stage: dict[str, float]
    tolerance: float
    mismatches: tuple[Mismatch, ...]
    reference: str = "numpy float64"

    @property
    def passed(self) -> bool:
        return not self.mismatches

    @property
    def max_abs_error(self) -> float:
        return max(self.per_stage.values(), default=0.0)

    def as_dict(self) -> dict:
        return {
            "reference": self.reference,
            "max_abs_error": self.max_abs_error,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "per_stage": dict(self.per_stage),
        }


def crosscheck(derivation: Derivation, tolerance: float = TOLERANCE) -> CrossCheck:
    """Compare each exact stage (evaluated at 30 digits) with NumPy float64."""
    reference = numeric_stages(derivation.problem)
    per_stage: dict[str, float] = {}
    mismatches: list[Mismatch] = []
    for step in derivation.steps:
        numeric = reference.get(step.id)
        if numeric is None:
            raise AssertionError(f"the NumPy reference has no stage {step.id!r}")
        exact = derivation.evaluate(step.id, PRECISION)
        if numeric.shape != (len(exact), len(exact[0])):
            raise AssertionError(f"stage {step.id}: shapes differ {numeric.shape}")
        worst = 0.0
        for i, row in enumerate(exact):
            for j, value in enumerate(row):
                got = float(numeric[i, j])
                if mpmath.isinf(value) or math.isinf(got):
                    same = mpmath.isinf(value) and math.isinf(got) and (value < 0) == (got < 0)
                    if not same:
                        mismatches.append(Mismatch(step.id, i, j, float(value), got))
                        worst = math.inf
                    continue
                error = math.inf if math.isnan(got) else float(abs(value - got))
                worst = max(worst, error)
                if error > tolerance * max(1.0, abs(float(value))):
                    mismatches.append(Mismatch(step.id, i, j, float(value), got))
        per_stage[step.id] = worst
    return CrossCheck(per_stage, tolerance, tuple(mismatches))
