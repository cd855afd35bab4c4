"""The tests' own exact arithmetic, shared by the files that check symattn against it.

Entries are read from a problem's YAML text (``yaml.BaseLoader``: every scalar a string)
with :class:`fractions.Fraction`, and matrices are multiplied by hand: nothing here goes
through symattn, SymPy or a binary float. Problem and answers files are written as text.

The last section is the error bound of a central finite difference, shared by the tests
that check gradients against one: a tolerance derived from the step and the loss's own
magnitudes, never a guessed figure.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import mpmath
import numpy as np


def frac(text: str, values: dict[str, Fraction] | None = None) -> Fraction:
    """``"3"``, ``"-2/5"``, ``"0.25"``, ``"2e-1"`` exactly; a declared symbol takes its value."""
    assert isinstance(text, str), f"BaseLoader should give strings, got {text!r}"
    text = text.strip()
    if values and text in values:
        return values[text]
    if "/" in text:
        num, den = text.split("/")
        return Fraction(num.strip()) / Fraction(den.strip())
    return Fraction(text)


def fmatrix(rows, values: dict[str, Fraction] | None = None) -> list[list[Fraction]]:
    return [[frac(x, values) for x in row] for row in rows]


def fmatmul(a, b):
    assert len(a[0]) == len(b), (len(a[0]), len(b))
    return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0)) for j in range(len(b[0]))]
            for i in range(len(a))]


def ftranspose(a):
    return [list(col) for col in zip(*a)]


def allowed_grid(mask, n_q: int, n_k: int) -> list[list[bool]]:
    """The mask rules of the spec, written again from scratch."""
    if mask == "none":
        return [[True] * n_k for _ in range(n_q)]
    if mask == "causal":
        return [[j <= i for j in range(n_k)] for i in range(n_q)]
    if mask == "causal-bottom-right":
        return [[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)]
    if isinstance(mask, list) and mask and not isinstance(mask[0], list):  # a list of masks: their AND
        parts = [allowed_grid(m, n_q, n_k) for m in mask]
        return [[all(p[i][j] for p in parts) for j in range(n_k)] for i in range(n_q)]
    if isinstance(mask, dict) and "padding" in mask:  # one 0/1 entry per key, for every query
        return [[str(mask["padding"][j]) == "1" for j in range(n_k)] for _ in range(n_q)]
    if isinstance(mask, dict) and "valid-length" in mask:  # keys 1..n are real (1-based)
        return [[j < int(mask["valid-length"]) for j in range(n_k)] for _ in range(n_q)]
    if isinstance(mask, dict):
        w = int(mask["sliding-window"])
        return [[j <= i and i - j < w for j in range(n_k)] for i in range(n_q)]
    truth = {"1": True, "true": True, "0": False, "false": False}
    return [[truth[x.strip().lower()] for x in row] for row in mask]


def quoted(x: Fraction) -> str:
    """A Fraction as a YAML string, ``"-2/5"``."""
    return f'"{x}"'


def yaml_matrix(rows) -> str:
    """A matrix in flow style, each Fraction quoted and any other entry as written."""
    return "[" + ", ".join("[" + ", ".join(quoted(x) if isinstance(x, Fraction) else x for x in row) + "]"
                           for row in rows) + "]"


# -- answers files, as a student would write them -------------------------------------------


def rounded(v, places: int) -> str:
    """``v`` (an mpmath number) rounded half away from zero to ``places`` decimals, as text
    (−∞ as ``-inf``)."""
    if mpmath.isinf(v) and v < 0:
        return "-inf"
    d = Decimal(mpmath.nstr(v, 45, min_fixed=-mpmath.inf, max_fixed=mpmath.inf))
    text = format(d.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP), "f")
    return text[1:] if re.fullmatch(r"-0\.0*", text) else text


def rounded_grid(values, places: int = 4) -> list[list[str]]:
    return [[rounded(v, places) for v in row] for row in values]


_PLAIN = re.compile(r"-?[0-9]+(\.[0-9]+)?\Z|-inf\Z")


def answers_text(stages: dict[str, list[list[str]]]) -> str:
    """An answers file: each stage a block of rows; expressions quoted, numbers plain."""
    lines = []
    for sid, rows in stages.items():
        lines.append(f"{sid}:")
        for row in rows:
            lines.append("  - [" + ", ".join(x if _PLAIN.match(x) else f'"{x}"' for x in row) + "]")
    return "\n".join(lines) + "\n"


# -- central finite differences: how far one may be from the derivative ---------------------

FLOAT64_UNIT_ROUNDOFF = 2.0 ** -53
EXP_ULPS = 4  # exp's error in units in the last place: libm gives 1, NumPy's SIMD loops a few


def central_difference_bound(d_h, d_half, h, rounding, unit_roundoff=FLOAT64_UNIT_ROUNDOFF):
    """How far the central difference ``d_h`` = (f(x + h) − f(x − h)) / 2h may be from f′(x).

    ``d_half`` is the same difference with the step h/2, and ``rounding`` bounds the error of
    one evaluation of f in its arithmetic. Two errors add up:

    - truncation: d(h) = f′ + c·h² + r·c·h² (r·c·h² the terms in h⁴ and beyond), so
      d(h) − d(h/2) = c·h²·(3/4 + 15r/16), and 2·|d(h) − d(h/2)| ≥ |c·h²·(1 + r)| while
      |r| ≤ 1/2 (Richardson; 4/3 would do for the h² term alone). That difference also holds
      both steps' rounding (below: at most rounding/h + 2·rounding/h), so its double adds at
      most 6·rounding/h;
    - rounding: f(x ± h) are each off by at most ``rounding``: (δ₊ + δ₋)/2h ≤ rounding/h.

    Together 2·|d(h) − d(h/2)| + 7·rounding/h, and 3·u·|d(h)| for the difference's own
    subtraction, step and division. Works entrywise on NumPy arrays (an array ``h`` gives
    each entry its own step) and on mpmath numbers (with their ``unit_roundoff``).
    """
    if isinstance(d_h, np.ndarray):
        return 2 * np.abs(d_h - d_half) + 7 * rounding / h + 3 * unit_roundoff * np.abs(d_h)
    return 2 * abs(d_h - d_half) + 7 * rounding / h + 3 * unit_roundoff * abs(d_h)


def _gamma(n: int, unit_roundoff: float) -> float:
    """γₙ = n·u / (1 − n·u): the relative error of n roundings (Higham, §3.1)."""
    assert n * unit_roundoff < 0.5, (n, unit_roundoff)
    return n * unit_roundoff / (1 - n * unit_roundoff)


def _magnitude(kind: str, value: np.ndarray) -> np.ndarray:
    """|value|, and for the softmax's input Ŝ (−∞ where masked) |Ŝ| + |Ŝ − m| + EXP_ULPS on
    its finite entries: Ŝ = scale·S + M rounds by |Ŝ|, z = Ŝ − m by |z|, and exp(z) with
    EXP_ULPS ulps is exp(z + δ) with |δ| ≤ EXP_ULPS·u. Masked entries count 0."""
    value = np.asarray(value, dtype=float)
    if kind != "S_masked":
        return np.abs(value)
    finite = np.isfinite(value)
    top = np.where(finite, value, -np.inf).max(axis=1, keepdims=True)
    return np.where(finite, np.abs(np.where(finite, value, 0)) + np.abs(np.where(finite, value - top, 0))
                    + EXP_ULPS, 0.0)


def _roundings(kind: str, value: np.ndarray, final: bool) -> int:
    """How many units of roundoff the pass puts on a stage, relative to its magnitude: the
    inner products are put on one operand each (W in X·W, Q in Q·Kᵀ, A in A·V, W_O in
    concat·W_O), as backward stability allows (Higham, ch. 3)."""
    rows, cols = np.shape(value)
    if kind in ("W_Q", "W_K", "W_V", "W_O"):
        return rows                     # an inner product of that many terms
    if kind == "Q":
        return cols + 1                 # S = Q·Kᵀ, d_k terms; the bias b_Q added
    if kind in ("K", "V", "S", "S_masked", "X", "X_pos"):
        return 1                        # a bias added, the scale, M added (and z, exp: _magnitude), PE added
    if kind == "A":
        return 2 * cols + 1             # the softmax's sum and division, then A·V
    if kind == "O" and final:
        return rows * cols + 2          # b_O added, and the loss: its n terms summed, each formed
    return 0                            # a copy (a head's O in concat), a bias (counted where added)


def attention_loss_rounding(stages: dict, gradients: dict, unit_roundoff: float = FLOAT64_UNIT_ROUNDOFF,
                            target=None) -> float:
    """A first-order bound on the rounding error of one evaluation of an attention loss.

    ``stages`` holds the forward matrices by symattn's stage ids (``Q``, ``S``, ``S_masked``,
    ``A``, ``O``, ``head1.W_Q``, ``X_pos``, ...; values as floats), ``gradients`` the loss's
    gradient with respect to each (``dQ``, ``head1.dW_Q``, ...), ``target`` the T of
    ``loss: target``. Each operation of the pass is backward stable: its result is exact for
    an operand changed by a relative γ_n (an inner product of n terms) or u (a scale, a bias,
    the softmax's division, the loss's own terms). To first order L then moves by at most
    that relative change times Σ |∂L/∂stage|·|stage|: the sum over the stages of
    γ_k·Σ |gradient|·|stage| with k from ``_roundings`` (the softmax's input also carries
    exp's error, see ``_magnitude``). Terms of order u² are left out.
    """
    total = 0.0
    for gid, g in gradients.items():
        pre, _, name = gid.rpartition(".")
        assert name.startswith("d"), gid
        kind = name[1:]
        of = (pre + "." if pre else "") + kind
        if kind == "X" and "X_pos" in stages:  # X_pos = X + PE feeds the projections
            of = "X_pos"
        value = np.asarray(stages[of], dtype=float)
        if of == "O" and target is not None:  # ½‖O − T‖²: O − T rounds by |O − T| ≤ |O| + |T|
            magnitude = np.abs(value) + np.abs(np.asarray(target, dtype=float))
        else:
            magnitude = _magnitude(kind, value)
        g = np.asarray(g, dtype=float)
        assert g.shape == magnitude.shape, (gid, g.shape, magnitude.shape)
        total += _gamma(_roundings(kind, value, final=of == "O"), unit_roundoff) * float(np.sum(np.abs(g) * magnitude))
    return total
