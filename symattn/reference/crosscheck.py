"""The cross-check: exact values at high precision against the NumPy reference.

The two are zipped by stage id; every entry is compared and the largest
difference of each stage reported. A −∞ must meet a −∞ in the same place.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import sympy

from .. import stages
from ..exact.derivation import Derivation
from ..problem.model import CROSS_ENTROPY
from .numeric import numeric_stages

TOLERANCE = 1e-9  # relative to max(1, |value|): float64 at these sizes is far better
PRECISION = 30  # digits of the exact values' evaluation
FD_STEP = 1e-6  # the central differences' step, relative to each entry (and half of it, for their bound)
FD_MAX_ENTRIES = 10_000  # beyond this the finite differences (two steps) would take longer than the derivation
SKIPPED_TOO_LARGE = "some exact values exceed float64's range (about 1.8e308), so NumPy cannot follow them"
SKIPPED_NO_VALUES = (
    "the problem has symbols without values; give values: {name: number} to check it numerically"
)


@dataclass(frozen=True)
class Mismatch:
    stage: str
    row: int
    col: int
    exact: float
    numeric: float
    reference: str = "numpy float64"

    def __str__(self) -> str:
        """``S[2,1]: exact value ... but NumPy gives ...``: the entry counted from 1, as the
        worked solution's subscripts are (``row``/``col`` stay 0-based for JSON and code)."""
        who = ("NumPy" if self.reference.startswith("numpy") else "PyTorch" if self.reference.startswith("torch")
               else "finite differences" if "finite differences" in self.reference else self.reference)
        return f"{self.stage}[{self.row + 1},{self.col + 1}]: exact value {self.exact!r} but {who} gives {self.numeric!r}"


@dataclass(frozen=True)
class CrossCheck:
    """The outcome of comparing every stage with the NumPy float64 reference."""

    per_stage: dict[str, float]
    tolerance: float
    mismatches: tuple[Mismatch, ...]
    reference: str = "numpy float64"
    skipped: str | None = None  # why no comparison was made (symbols without values)
    torch: "CrossCheck | None" = None  # the PyTorch comparison, when asked for
    finite_differences: "CrossCheck | None" = None  # the gradients against finite differences

    @property
    def passed(self) -> bool | None:
        """True or False (False if the PyTorch comparison failed too); None when skipped."""
        if self.skipped is not None:
            return None
        return not self.all_mismatches

    @property
    def all_mismatches(self) -> tuple[Mismatch, ...]:
        others = (self.torch, self.finite_differences)
        return self.mismatches + tuple(m for other in others if other is not None for m in other.mismatches)

    @property
    def max_abs_error(self) -> float:
        return max(self.per_stage.values(), default=0.0)

    def as_dict(self) -> dict:
        out = {
            "reference": self.reference,
            "max_abs_error": None if self.skipped else self.max_abs_error,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "per_stage": dict(self.per_stage),
        }
        if self.skipped:
            out["skipped"] = self.skipped
        if self.torch is not None:
            out["torch"] = self.torch.as_dict()
        if self.finite_differences is not None:
            out["finite_differences"] = self.finite_differences.as_dict()
        return out


def crosscheck(derivation: Derivation, tolerance: float = TOLERANCE, *, torch: bool = False) -> CrossCheck:
    """Compare each exact stage (evaluated at 30 digits) with NumPy float64.

    With ``torch=True`` the weights and outputs are also compared with PyTorch's
    ``scaled_dot_product_attention`` in float64 (``CrossCheck.torch``). A
    problem with symbols is compared at its ``values``; without values the
    check is skipped (``passed`` is None and ``skipped`` says why). The result is recorded as
    the derivation's ``last_check``, which its summary (``repr(derivation)``) and notebook page report.
    """
    result = _crosscheck(derivation, tolerance, torch)
    derivation.record_check(result)
    return result


def _crosscheck(derivation: Derivation, tolerance: float, torch: bool) -> CrossCheck:
    if not derivation.can_evaluate:
        return CrossCheck({}, tolerance, (), skipped=SKIPPED_NO_VALUES)
    if _beyond_float64(derivation):
        return CrossCheck({}, tolerance, (), skipped=SKIPPED_TOO_LARGE)
    angles = _float64_angles(derivation, tolerance)
    if angles.cannot is not None:  # NumPy would overflow or hold the base as 0 (with RuntimeWarnings)
        return CrossCheck({}, tolerance, (), skipped=angles.cannot)
    p = derivation.problem
    reference = numeric_stages(p)
    fd_check = None
    if p.backward is not None:
        from .numeric_backward import numeric_gradients

        reference.update(numeric_gradients(p))
        if p.backward.kind == CROSS_ENTROPY:
            fd_check = CrossCheck({}, 0.0, (), reference="central finite differences",
                                  skipped="the cross-entropy's gradients through the MLP and the head are checked "
                                          "against NumPy's chain rule and PyTorch's autograd, not finite differences")
        elif _fd_size(p) <= FD_MAX_ENTRIES:
            fd_check = _finite_differences(derivation)
        else:
            fd_check = CrossCheck({}, 0.0, (), reference="central finite differences",
                                  skipped=f"more than {FD_MAX_ENTRIES:,} entries to perturb one by one")
    numpy_check = compare(derivation, reference, tolerance, "numpy float64", every=True)
    numpy_check = dataclasses.replace(numpy_check, finite_differences=fd_check)
    if not torch:
        return _precision(derivation, numpy_check, angles)
    from .pytorch import torch_stages

    torch_reference = torch_stages(p)
    if p.backward is not None:
        from .torch_backward import torch_gradients

        torch_reference.update(torch_gradients(p))
    torch_check = compare(derivation, torch_reference, tolerance,
                          "torch scaled_dot_product_attention float64")
    return _precision(derivation, dataclasses.replace(numpy_check, torch=torch_check), angles)


_EPS = 2.0 ** -52  # float64's spacing at 1
_SCORES = (stages.S, stages.S_SCALED, stages.S_MASKED)
_LINEAR_SLACK = 2.0 ** 8  # rounding accumulated along a product, a generous bound


def _precision(derivation: Derivation, check: CrossCheck, angles: "_Angles | None" = None) -> CrossCheck:
    """``check``, or, when every difference is what float64's rounding of numbers this large
    can make, the check marked skipped with that reason (the exact values are not in doubt).

    Angles first (``angles``, see :func:`_float64_angles`): when float64's rounding of RoPE's or
    the sinusoidal positions' angles can move an entry by more than the tolerance, every
    difference at a stage computed from the angles is excused by that.

    Two scores of 10^20 + 4 and 10^20 are the same float64, so NumPy gives the two keys equal
    weights; that is NumPy lacking the precision, not the derivation being wrong. A weight (or
    anything after the softmax) is excused when the largest score times float64's spacing
    exceeds the tolerance; a stage before the softmax when its difference is within the
    rounding of the largest number so far.
    """
    mismatches = check.all_mismatches
    if not mismatches:
        return check
    if angles is not None and angles.doubt is not None and all(m.stage in angles.stages for m in mismatches):
        return dataclasses.replace(check, skipped=f"{angles.doubt} (at {mismatches[0]}); the exact derivation "
                                                  "does not depend on float64")
    largest = 0.0  # the largest finite magnitude of the stages so far
    score = 0.0  # the largest finite score
    worst_stage: dict[str, float] = {}
    after_softmax = False
    excused = True
    by_stage: dict[str, list[Mismatch]] = {}
    for m in mismatches:
        by_stage.setdefault(m.stage, []).append(m)
    for step in derivation.steps:
        values = derivation.approx(step.id)
        finite = np.abs(values[np.isfinite(values)]) if values.size else values
        top = float(finite.max()) if finite.size else 0.0
        largest = max(largest, top)
        name = stages.split_id(step.id)[1]
        if name in _SCORES:
            score = max(score, top)
        if name == stages.A:
            after_softmax = True
        for m in by_stage.get(step.id, ()):
            error = abs(m.exact - m.numeric) if math.isfinite(m.exact) and math.isfinite(m.numeric) else math.inf
            if after_softmax:
                ok = score * _EPS > check.tolerance
            else:
                ok = error <= largest * _EPS * _LINEAR_SLACK
            excused = excused and ok
            worst_stage.setdefault(step.id, error)
    if not excused or not worst_stage:
        return check
    first = mismatches[0]
    ulp = float(np.spacing(np.float64(max(score, largest))))
    reason = (
        f"NumPy's float64 lacks the precision for this problem: numbers as large as {max(score, largest):.3g} "
        f"are rounded to a multiple of {ulp:.3g}, so it cannot tell apart values that differ by less "
        f"(at {first}); the exact derivation does not depend on float64"
    )
    return dataclasses.replace(check, skipped=reason)


_U = 2.0 ** -53  # float64's unit roundoff: a correctly rounded operation is off by at most this, relatively
_LN_MAX = math.log(float(np.finfo(np.float64).max))  # about 709.78: ln of the largest float64
# Roundings in one angle of the float64 references (numeric.py, torch_check.py) besides the
# base's own, each relative and at most u: the exponent -2i/d (it multiplies ln(base) in the
# power: the term u·|ln base|), the power (within 1 ulp, 2u), the reciprocal of torch's
# 1/base^(2i/d), and the product p·θ (given angles: the product alone).
_ANGLE_ROUNDINGS = 4


@dataclass(frozen=True)
class _Angles:
    """What float64 makes of the problem's angles. ``cannot``: why NumPy cannot follow them at all
    (a base float64 rounds to 0, a θ_i or an angle beyond its range), or None. ``doubt``: why
    the reference's entries computed from the angles can be off by more than the tolerance, or
    None. ``stages``: the ids of the stages computed from the angles."""

    cannot: str | None = None
    doubt: str | None = None
    stages: frozenset = frozenset()


def _float64_angles(derivation: Derivation, tolerance: float) -> _Angles:
    """How far the float64 references can follow RoPE's angles p·θ_i (θ_i = base^(−2i/d_k), or
    given) and the sinusoidal positions' p/base^(2i/d), p = 0 … n − 1.

    The references turn each angle into cos and sin, which are known only as well as the angle
    is: to first order in u = 2^-53, an angle φ = p·θ_i is rounded by at most
    ``δ = (ε + (4 + |ln base|)·u)·|φ|``, where ε is the base's own rounding to float64 (worked
    out exactly: at most u for a normal float64, up to 1 below 2.2e-308; 2u for a given angle)
    and the rest are the roundings of :data:`_ANGLE_ROUNDINGS`, the exponent's amplified by
    the power. Turning a pair (x_a, x_b) of norm r by δ too much moves each of its two entries
    by at most r·δ (a chord is shorter than its arc); a sinusoidal entry moves by at most δ.
    Where that exceeds what the comparison allows (the tolerance times max(1, |entry|)),
    differences from the angles are no sign of a bug: ``doubt`` says so. An angle of 10^30 rad
    is rounded by about 10^14 rad, so its cosine is anyone's guess.

    A base float64 rounds to 0, or a θ_i or angle past its largest number (about 1.8e308,
    which NumPy would turn into inf, then NaN, with RuntimeWarnings), is ``cannot``, decided
    from the exact values' logarithms before NumPy sees them.
    """
    p = derivation.problem
    parts = []  # (whose angles, the base or None, the given angles or None, the ids of the stages they turn)
    if p.rope is not None:
        ids = [s.id for s in derivation.steps if stages.split_id(s.id)[1] in (stages.Q_ROT, stages.K_ROT)]
        parts.append(("RoPE's", p.rope.base, p.rope.angles, ids))
    if p.positions is not None and p.positions.kind == "sinusoidal":
        parts.append(("the sinusoidal positions'", p.positions.base, None, [stages.PE]))
    if not parts:
        return _Angles()
    doubt = None
    for whose, base, given, ids in parts:
        if base is not None and float(base) == 0:
            return _Angles(cannot=f"{whose} base {sympy.N(base, 3)!s} is below float64's smallest number "
                                  "(about 4.9e-324), so NumPy would hold it as 0")
        ln_base = 0.0 if base is None else math.log(float(base))
        per_radian = rounding_per_radian(base)
        for sid in ids:
            rows, d = derivation.step(sid).shape
            if given is not None:
                ln_theta = [_ln_abs(a) for a in given]
            else:  # θ_i = base^(−2i/d): RoPE's pairs i < d/2, the sinusoidal columns' i < ⌈d/2⌉
                ln_theta = [-(2 * i / d) * ln_base for i in range((d + 1) // 2 if sid == stages.PE else d // 2)]
            ln_last = math.log(rows - 1) if rows > 1 else -math.inf  # the last position, p = n − 1
            worst = max(ln_theta) + ln_last
            for name, ln in (("θ_i", max(ln_theta)), ("angles", worst)):
                if ln > _LN_MAX:
                    return _Angles(cannot=f"{whose} {name} reach about 10^{ln / math.log(10):.0f} radians, beyond "
                                          "float64's range (about 1.8e308)")
            if doubt is not None or worst == -math.inf:
                continue
            theta = np.exp(np.array(ln_theta))  # finite: each ln θ_i is at most ln(max float64)
            delta = per_radian * np.arange(rows, dtype=np.float64)[:, None] * theta[None, :]  # (position, i)
            values = derivation.approx(sid)
            if sid == stages.PE:
                moved = delta > tolerance  # |sin|, |cos| ≤ 1: the comparison allows the tolerance
            else:
                first, second = (list(c) for c in zip(*p.rope.pairs(d)))  # the pairs' components, pair by pair
                r = np.hypot(values[:, first], values[:, second])  # a turn keeps a pair's norm
                smaller = np.minimum(np.abs(values[:, first]), np.abs(values[:, second]))
                moved = r * delta > tolerance * np.maximum(1.0, smaller)  # for the pair's stricter entry
            if moved.any():
                largest = float(np.exp(worst))
                doubt = (f"float64 cannot hold {whose} angles closely enough: an angle as large as {largest:.3g} "
                         f"radians is rounded by up to {float(delta.max()):.3g} radians, which moves the entries "
                         "computed from it by more than the tolerance")
    if doubt is None:
        return _Angles()
    return _Angles(doubt=doubt, stages=frozenset(_from_angles(derivation)))


def rounding_per_radian(base) -> float:
    """δ/|φ|: how far the float64 references may round an angle φ, per radian of it, to first
    order in u = 2^-53 (see :func:`_float64_angles`): ε + (4 + |ln base|)·u, ε the base's own
    rounding to float64, worked out exactly (at most u for a normal float64, more for a
    subnormal one; a base float64 holds exactly, such as 2^-1074, has none). ``base`` None:
    given angles, each rounded from SymPy within 1 ulp (ε = 2u)."""
    if base is None:
        return (2 + _ANGLE_ROUNDINGS) * _U
    b = float(base)
    rounded = float(abs(sympy.Rational(b) - base) / base)
    return rounded + (_ANGLE_ROUNDINGS + abs(math.log(b))) * _U


def _from_angles(derivation: Derivation) -> list[str]:
    """The ids of the stages computed from the angles: everything from the rotation (or the
    positions) on but the given matrices, and, with RoPE, what does not read a rotation: Q, K
    and V, the mask, and V's cache."""
    p = derivation.problem
    before = {stages.Q, stages.K, stages.V, stages.M, stages.V_CACHE} if p.positions is None else set()
    return [s.id for s in derivation.steps if not s.given and stages.split_id(s.id)[1] not in before]


def _ln_abs(x) -> float:
    """ln|x| of an exact angle (−inf for 0), from 20 digits of its value."""
    value = abs(sympy.N(x, 20))
    return -math.inf if value == 0 else float(sympy.log(value).evalf(20))


def _fd_size(p) -> int:
    """How many entries the finite differences perturb (each costs two forward passes)."""
    n_q, n_k = p.n_q, p.n_k
    total = n_q * p.d_out + 2 * n_q * n_k  # dO, dA, dS_masked, dS
    for head in (p.heads or [None]):
        d_k = head.d_k if head else p.d_k
        d_v = head.d_v if head else p.d_v
        total += n_q * d_k + n_k * (d_k + d_v) + 2 * n_q * n_k
        if head:
            total += (p.d_model) * (2 * d_k + d_v)
    if p.projected:
        total += (n_q + (n_k if p.context is not None else 0)) * p.d_model
    return total


def _beyond_float64(derivation: Derivation) -> bool:
    """Whether some exact value is too large for a float64 reference to follow."""
    for step in derivation.steps:
        values = derivation.approx(step.id)
        if values.size:  # two passes with no temporary decide most (an embedding table's 38M entries)
            top, bottom = float(values.max()), float(values.min())  # NaN if any entry is NaN
            if math.isnan(top) or math.isnan(bottom) or top == math.inf:
                return True
            if top <= 1e300 and bottom >= -1e300:
                continue
        if np.isnan(values).any() or np.isposinf(values).any():
            return True
        finite = values[np.isfinite(values)]
        if finite.size and np.abs(finite).max() > 1e300:
            return True
    return False


def _finite_differences(derivation: Derivation) -> CrossCheck:
    """The exact gradients against central differences of the NumPy forward pass, each entry
    held to its own bound (:mod:`symattn.reference.fd_bound`: truncation from the step and half of it,
    the loss's rounding over the step), plus two units of roundoff of the exact value's own
    rounding to float64. The check's ``tolerance`` is the largest of those bounds."""
    from .fd_bound import FLOAT64_UNIT_ROUNDOFF, finite_differences_with_bounds

    exact = {i: derivation.approx(i) for i in derivation.ids}
    gradients = {s.id: exact[s.id] for s in derivation.steps if s.kind_of is not None and s.kind_of.gradient}
    stages = {i: v for i, v in exact.items() if i not in gradients}
    fd, bounds = finite_differences_with_bounds(derivation.problem, FD_STEP, gradients, stages)
    for stage in bounds:
        if stage in exact:
            bounds[stage] = bounds[stage] + 2 * FLOAT64_UNIT_ROUNDOFF * np.abs(np.where(np.isfinite(exact[stage]), exact[stage], 0))
    largest = max((float(np.max(b)) for b in bounds.values() if np.size(b)), default=0.0)
    return compare(derivation, fd, largest, "central finite differences of the numpy forward pass", bounds=bounds)


def compare(derivation: Derivation, reference: dict, tolerance: float, name: str, every: bool = False,
            bounds: dict | None = None) -> CrossCheck:
    """Compare the exact stages with ``reference`` (stage id → float64 array).

    The exact values are rounded to float64 from their fractions or their 30-digit
    values (an error of half a unit in the last place, far below the tolerance).
    An entry differs by more than ``tolerance`` relative to max(1, |exact|), or with
    ``bounds`` (stage id → array) by more than its own bound. With ``every``, the
    reference must have every stage; otherwise the stages it has are compared.
    """
    per_stage: dict[str, float] = {}
    mismatches: list[Mismatch] = []
    for step in derivation.steps:
        numeric = reference.get(step.id)
        if numeric is None:
            if every:
                raise AssertionError(f"the {name} reference has no stage {step.id!r}")
            continue
        exact = derivation.approx(step.id)
        numeric = np.asarray(numeric, dtype=np.float64)
        if numeric.shape != exact.shape:
            raise AssertionError(f"stage {step.id}: shapes differ {numeric.shape}")
        if numeric is exact and bounds is None:  # a given matrix's own float64 entries, shared: no difference
            per_stage[step.id] = 0.0
            continue
        worst = 0.0
        bound = None if bounds is None else np.broadcast_to(np.asarray(bounds[step.id], dtype=np.float64), exact.shape)
        for first in range(0, exact.shape[0], _COMPARE_ROWS):  # a block of rows at a time: bounded temporaries
            rows = slice(first, first + _COMPARE_ROWS)
            worst = max(worst, _compare_block(exact[rows], numeric[rows], first, tolerance, step.id, name, mismatches,
                                              None if bound is None else bound[rows]))
        per_stage[step.id] = worst
    return CrossCheck(per_stage, tolerance, tuple(mismatches), reference=name)


_COMPARE_ROWS = 256


def _compare_block(exact, numeric, first: int, tolerance: float, stage: str, name: str, mismatches: list,
                   bound=None) -> float:
    """The largest difference of a block of rows starting at row ``first``; its mismatches appended
    (an entry's allowance ``tolerance``·max(1, |exact|), or its ``bound``)."""
    e_inf, n_inf = np.isinf(exact), np.isinf(numeric)
    # An infinity must meet the same infinity in the same place.
    inf_bad = (e_inf | n_inf) & ~(e_inf & n_inf & (np.sign(exact) == np.sign(numeric)))
    finite = ~(e_inf | n_inf)
    with np.errstate(invalid="ignore"):
        error = np.where(finite, np.abs(exact - numeric), 0.0)
    error[np.isnan(error)] = np.inf  # NumPy gave NaN
    with np.errstate(invalid="ignore"):
        allowed = tolerance * np.maximum(1.0, np.abs(exact)) if bound is None else bound
    bad = finite & (error > allowed)
    worst = float(error.max()) if error.size else 0.0
    if inf_bad.any():
        worst = math.inf
    for i, j in zip(*np.nonzero(bad | inf_bad)):
        mismatches.append(Mismatch(stage, first + int(i), int(j), float(exact[i, j]), float(numeric[i, j]), name))
    return worst
