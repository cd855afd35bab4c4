"""The relations' operations in NumPy float64 (see :class:`symattn.exact.ops.Ops`), for a gradient
that the cross-check compares with another float64 computation."""

from __future__ import annotations

import flint

from ..numbers.matrices import is_rational
from .arb import angle_digits, arb_angle, arb_float, arb_floats, arb_precision
from .arb_ops import ArbOps
from .evaluation import approx, to_mpf
from .numeric_ops import NumericOps


class FloatOps(ArbOps):
    """The relations' operations in NumPy float64, for a gradient that the cross-check compares
    with another float64 computation: a value is a float64 array (a rational matrix is rounded
    once, entry by entry). Only for a problem whose values all lie well inside float64's range
    (:meth:`Derivation.approx` checks, and falls back to arb when a result is not finite)."""

    def __init__(self) -> None:
        super().__init__(30)

    def grid(self, x):
        import numpy

        if isinstance(x, numpy.ndarray):
            return x
        if isinstance(x, flint.arb_mat):
            return numpy.array(arb_floats(x), dtype=numpy.float64).reshape(x.nrows(), x.ncols())
        values = approx(x)
        if values is None:
            values = numpy.array([[float(v) for v in row] for row in NumericOps.grid(self, x)], dtype=numpy.float64)
        return values

    def matmul(self, a, b):
        return self.grid(a) @ self.grid(b)

    def T(self, a):
        return self.grid(a).T

    def add_row(self, m, row):
        return self.grid(m) + self.grid(row)

    def col_sums(self, m):
        return self.grid(m).sum(axis=0, keepdims=True)

    def scale(self, a, factor):
        return self.grid(a) * float(to_mpf(factor, 30))

    def softmax_backward(self, a, dA):
        a, g = self.grid(a), self.grid(dA)
        return a * (g - (a * g).sum(axis=1, keepdims=True))

    def rotate(self, m, thetas, pairs, sign: int = 1, offset: int = 0):
        """RoPE in float64, each cosine and sine rounded from its ball (the angle taken exactly)."""
        import numpy

        x = self.grid(m)
        out = x.copy()
        turns = [sign * (p + offset) for p in range(x.shape[0])]
        dps = 20 + angle_digits(thetas, max(map(abs, turns), default=0))
        with arb_precision(dps):
            angles = [arb_angle(theta, dps) for theta in thetas]
            cos = numpy.array([[arb_float((theta * t).cos()) for theta in angles] for t in turns]).reshape(len(turns), -1)
            sin = numpy.array([[arb_float((theta * t).sin()) for theta in angles] for t in turns]).reshape(len(turns), -1)
        for i, (a, b) in enumerate(pairs):
            out[:, a] = x[:, a] * cos[:, i] - x[:, b] * sin[:, i]
            out[:, b] = x[:, a] * sin[:, i] + x[:, b] * cos[:, i]
        return out

    def hadamard(self, a, b):
        return self.grid(a) * self.grid(b)

    def times_row(self, m, row):
        return self.grid(m) * self.grid(row)

    def normalise_backward(self, d, hat, spread, eps, centred: bool):
        import numpy

        g, h, s = self.grid(d), self.grid(hat), self.grid(spread)
        first = g.mean(axis=1, keepdims=True) if centred else 0.0
        return (g - first - h * (g * h).mean(axis=1, keepdims=True)) / numpy.sqrt(s + float(to_mpf(eps, 30)))

    def hstack(self, parts):
        import numpy

        return numpy.hstack([self.grid(p) for p in parts])

    def vstack(self, parts):
        import numpy

        return numpy.vstack([self.grid(p) for p in parts])

    def softcap(self, a, cap):
        import numpy

        c = float(cap)
        return c * numpy.tanh(self.grid(a) / c)

    def block(self, m, first: int, width: int):
        return self.grid(m)[:, first:first + width]

    def sum(self, parts):
        total = None
        for part in parts:
            total = self.grid(part) if total is None else total + self.grid(part)
        return total

    def sub(self, a, b):
        return self.grid(a) - self.grid(b)

    def ones(self, rows: int, cols: int):
        import numpy

        return numpy.ones((rows, cols))

    def table(self, rows: list[list[int]]):
        import numpy

        return numpy.array(rows, dtype=numpy.float64)

    def activate(self, m, name: str):
        """``act(m)`` (or its derivative, ``d:act``) in float64 (the cross-check's arithmetic)."""
        return FLOAT_ACTIVATIONS[name](self.grid(m))

    def is_rational(self, x) -> bool:
        import numpy

        return not isinstance(x, (list, flint.arb_mat, numpy.ndarray)) and is_rational(x)



def _erf(x):
    import math

    import numpy

    return numpy.vectorize(math.erf, otypes=[float])(x)


def _gelu_tanh(x, slope: bool = False):
    import numpy

    root, c = numpy.sqrt(2 / numpy.pi), 0.044715
    t = numpy.tanh(root * (x + c * x**3))
    if not slope:
        return x / 2 * (1 + t)
    return (1 + t) / 2 + x * (1 - t**2) * root * (1 + 3 * c * x**2) / 2


def _normal_density(x):
    import numpy

    return numpy.exp(-x**2 / 2) / numpy.sqrt(2 * numpy.pi)


def _elu1(x):
    import numpy

    return numpy.where(x > 0, x + 1, numpy.exp(numpy.minimum(x, 0)))


def _sigmoid(x):
    import numpy

    return 1 / (1 + numpy.exp(-x))


FLOAT_ACTIVATIONS = {
    "relu": lambda x: x * (x > 0),
    "relu2": lambda x: (x * (x > 0)) ** 2,
    "gelu": lambda x: x / 2 * (1 + _erf(x / 2 ** 0.5)),
    "gelu-tanh": _gelu_tanh,
    "silu": lambda x: x * _sigmoid(x),
    "elu1": lambda x: _elu1(x),
    "identity": lambda x: x,
    "d:relu": lambda x: (x > 0).astype(float),
    "d:relu2": lambda x: 2 * x * (x > 0),
    "d:gelu": lambda x: (1 + _erf(x / 2 ** 0.5)) / 2 + x * _normal_density(x),
    "d:gelu-tanh": lambda x: _gelu_tanh(x, slope=True),
    "d:silu": lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
}
