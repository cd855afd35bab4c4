"""JSON output, exactly as the CLI/JSON contract gives it."""

from __future__ import annotations

import json

import mpmath
import sympy

from ..derivation import Derivation
from ._common import NEG_INF, written_exactly


def _approx(v) -> float | None:
    return None if v is None or mpmath.isinf(v) else float(v)


def _exact(x: sympy.Expr) -> str:
    """SymPy's str form (``sympify`` reads it back exactly), without the costly term sorting."""
    return "-oo" if x == NEG_INF else sympy.sstr(x, order="none")


def _numbers_only(m: sympy.Matrix) -> list[list]:
    """Decimals where an entry holds no symbol (None where it does): symbols without values."""
    from .._exact import to_mpf

    return [[None if m[i, j].free_symbols else to_mpf(m[i, j], 30) for j in range(m.cols)] for i in range(m.rows)]


def as_dict(derivation: Derivation, *, check=None) -> dict:
    d = derivation
    stages = []
    for step in d.steps:
        m = step.lazy
        values = d.evaluate(step.id, 30) if d.can_evaluate else _numbers_only(m)
        stages.append(
            {
                "id": step.id,
                "title": step.title,
                "shape": list(step.shape),
                # null where a big gradient's entries are too long to write (see backward.EXACT_LIMIT)
                "exact": ([[_exact(m[i, j]) for j in range(m.cols)] for i in range(m.rows)]
                          if written_exactly(step) else None),
                "approx": [[_approx(v) for v in row] for row in values],
            }
        )
    out = {"title": d.problem.title, "dims": d.dims, "stages": stages}
    if check is not None:
        out["crosscheck"] = check.as_dict()
    return out


def render_json(derivation: Derivation, *, check=None, digits: int | None = None) -> str:
    """The derivation as one JSON object (``digits`` is accepted and unused: JSON keeps full floats)."""
    return json.dumps(as_dict(derivation, check=check), indent=2, ensure_ascii=False) + "\n"
