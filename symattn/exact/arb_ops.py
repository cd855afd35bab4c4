"""The relations' operations on flint arb matrices at a number of digits (see
:class:`symattn.exact.ops.Ops`), for the gradients of a problem without symbols."""

from __future__ import annotations

import flint

from ..numbers.matrices import is_rational
from .arb import ArbProducts, ArbTransposed, angle_digits, arb_angle, arb_lines, arb_matrix, arb_precision, arb_scalar
from .block import ARB
from .numeric_ops import NumericOps


class ArbOps(NumericOps):
    """The relations' operations at ``dps`` digits on flint arb matrices, for a problem without
    symbols: products, sums and the softmax backward in ball arithmetic, never an mpmath number per
    entry. A value is an ``arb_mat`` or a rational matrix (read exactly). The gradients' relations
    need no −∞ (masked weights are 0), so the mask and the softmax are left to :class:`NumericOps`."""

    def __init__(self, dps: int) -> None:
        super().__init__(dps, None)
        self._transposed: dict = {}

    def grid(self, x):
        with arb_precision(self.dps):
            return arb_matrix(x, self.dps)

    def matmul(self, a, b):
        # made entry by entry (a row of a times a column of b) until needed whole
        return ArbProducts([(arb_lines(a, self.dps), arb_lines(b, self.dps))], self.dps)

    def T(self, a):
        """``aᵀ``, one per value (Xᵀ serves dW_Q, dW_K and dW_V): its rows are a's columns, read
        when a product asks for them, and it is transposed whole only if something needs that."""
        kept = self._transposed.get(id(a))
        if kept is None or kept[0] is not a:
            kept = self._transposed[id(a)] = (a, ArbTransposed(arb_lines(a, self.dps)))
        return kept[1]

    def add_row(self, m, row):
        with arb_precision(self.dps):
            m, row = arb_matrix(m, self.dps), arb_matrix(row, self.dps)
            return m + flint.arb_mat(m.nrows(), 1, [1] * m.nrows()) * row

    def col_sums(self, m):
        with arb_precision(self.dps):
            m = arb_matrix(m, self.dps)
            return flint.arb_mat(1, m.nrows(), [1] * m.nrows()) * m

    def scale(self, a, factor):
        with arb_precision(self.dps):
            return arb_matrix(a, self.dps) * arb_scalar(factor, self.dps)

    def softmax_backward(self, a, dA):
        """a ∘ (dA − rowsum(a ∘ dA)), row by row (a row with one allowed key gives exactly 0)."""
        with arb_precision(self.dps):
            a, g = arb_matrix(a, self.dps), arb_matrix(dA, self.dps)
            rows, cols = a.nrows(), a.ncols()
            out = flint.arb_mat(rows, cols)
            for i in range(rows):
                ar = [a[i, j] for j in range(cols)]
                gr = [g[i, j] for j in range(cols)]
                dot = sum((x * y for x, y in zip(ar, gr)), flint.arb(0))
                for j in range(cols):
                    out[i, j] = ar[j] * (gr[j] - dot)
            return out

    def rotate(self, m, thetas, pairs, sign: int = 1, offset: int = 0):
        """RoPE on balls: row ``p`` with each pair turned by ``sign·(p + offset)·θ_i`` (the backward pass
        turns a gradient back with ``sign = -1``), each angle with as many more digits as it has before
        the point, so its cosine and sine keep ``dps`` digits."""
        with arb_precision(self.dps):
            m = arb_matrix(m, self.dps)
        turns = [sign * (p + offset) for p in range(m.nrows())]
        extra = angle_digits(thetas, max(map(abs, turns), default=0))
        with arb_precision(self.dps + extra):
            angles = [arb_angle(theta, self.dps + extra) for theta in thetas]
            out = flint.arb_mat(m.nrows(), m.ncols())
            for p, turn in enumerate(turns):
                row = [m[p, j] for j in range(m.ncols())]
                for (a, b), theta in zip(pairs, angles):
                    phi = theta * turn
                    c, s = phi.cos(), phi.sin()
                    row[a], row[b] = row[a] * c - row[b] * s, row[a] * s + row[b] * c
                for j, x in enumerate(row):
                    out[p, j] = x
            return out

    def hstack(self, parts):
        with arb_precision(self.dps):
            blocks = [arb_matrix(p, self.dps) for p in parts]
            return flint.arb_mat([[b[i, j] for b in blocks for j in range(b.ncols())] for i in range(blocks[0].nrows())])

    def vstack(self, parts):
        with arb_precision(self.dps):
            blocks = [arb_matrix(p, self.dps) for p in parts]
            return flint.arb_mat([[b[i, j] for j in range(b.ncols())] for b in blocks for i in range(b.nrows())])

    def softcap(self, a, cap):
        with arb_precision(self.dps):
            m, c = arb_matrix(a, self.dps), arb_scalar(cap, self.dps)
            return flint.arb_mat([[c * (m[i, j] / c).tanh() for j in range(m.ncols())] for i in range(m.nrows())])

    def block(self, m, first: int, width: int):
        with arb_precision(self.dps):
            m = arb_matrix(m, self.dps)
            return flint.arb_mat([[m[i, j] for j in range(first, first + width)] for i in range(m.nrows())])

    def sum(self, parts):
        if all(isinstance(part, ArbProducts) and part._whole is None for part in parts):
            return ArbProducts([ab for part in parts for ab in part.parts], self.dps)
        with arb_precision(self.dps):
            total = None
            for part in parts:
                part = arb_matrix(part, self.dps)
                total = part if total is None else total + part
            return total

    def sub(self, a, b):
        with arb_precision(self.dps):
            return arb_matrix(a, self.dps) - arb_matrix(b, self.dps)

    def ones(self, rows: int, cols: int):
        return flint.arb_mat(rows, cols, [1] * (rows * cols))

    def given(self, m):
        return self.grid(m)

    def is_rational(self, x) -> bool:
        return not isinstance(x, (list, flint.arb_mat)) and is_rational(x)

    def _numeric(self, name):
        raise NotImplementedError(f"{name} is left to NumericOps")

    def mask(self, allowed, bias):
        self._numeric("the mask")

    def add_mask(self, scores, mask):
        self._numeric("adding the mask")

    def softmax(self, z, sink=None):
        self._numeric("the softmax")

    def sink_weight(self, a):
        self._numeric("the sink's weight")

    def divide_rows(self, m, d):
        self._numeric("linear attention's division by the normalisers")

    def hadamard(self, a, b):
        with arb_precision(self.dps):
            a, b = arb_matrix(a, self.dps), arb_matrix(b, self.dps)
            return flint.arb_mat([[a[i, j] * b[i, j] for j in range(a.ncols())] for i in range(a.nrows())])

    def normalise_backward(self, d, hat, spread, eps, centred: bool):
        """Back through a norm in ball arithmetic, row by row (see :meth:`Ops.normalise_backward`)."""
        with arb_precision(self.dps):
            g, h, s = arb_matrix(d, self.dps), arb_matrix(hat, self.dps), arb_matrix(spread, self.dps)
            e, cols = arb_scalar(eps, self.dps), g.ncols()
            out = flint.arb_mat(g.nrows(), cols)
            for i in range(g.nrows()):
                gr, hr = [g[i, k] for k in range(cols)], [h[i, k] for k in range(cols)]
                first = sum(gr, flint.arb(0)) / cols if centred else flint.arb(0)
                second = sum((x * y for x, y in zip(gr, hr)), flint.arb(0)) / cols
                inv = 1 / (s[i, 0] + e).sqrt()
                for k in range(cols):
                    out[i, k] = (gr[k] - first - hr[k] * second) * inv
            return out

    # the norm's forward operations are left to NumericOps (no gradient reads them)
    def row_mean(self, m):
        self._numeric("a norm's row means")

    def row_spread(self, m, mu, ddof: int = 0):
        self._numeric("a norm's row variances")

    def normalise(self, m, mu, spread, eps, inside: bool = True):
        self._numeric("a norm")

    def times_row(self, m, row):
        """``m`` with column k times ``row``'s entry k (dX̂ = dX_norm ∘ γ)."""
        with arb_precision(self.dps):
            m, row = arb_matrix(m, self.dps), arb_matrix(row, self.dps)
            return flint.arb_mat([[m[i, j] * row[0, j] for j in range(m.ncols())] for i in range(m.nrows())])


    def table(self, rows: list[list[int]]):
        return flint.arb_mat(rows)

    def activate(self, m, name: str):
        """``act(m)`` (or its derivative, ``d:act``) entry by entry in ball arithmetic."""
        f = ARB_ACTIVATIONS[name]
        with arb_precision(self.dps):
            m = arb_matrix(m, self.dps)
            return flint.arb_mat([[f(m[i, j]) for j in range(m.ncols())] for i in range(m.nrows())])


def _relu(x):
    if x > 0:
        return x
    if x <= 0:
        return flint.arb(0)
    return flint.arb(0).union(x)  # a ball around 0: both branches (its sign is not decided)


def _step(x):
    if x > 0:
        return flint.arb(1)
    if x <= 0:
        return flint.arb(0)  # 0 at 0, as PyTorch takes it
    return flint.arb(0).union(flint.arb(1))


def _gelu_tanh_slope(x):
    """GPT-2's GELU, differentiated (see symattn.exact.block)."""
    root = (2 / flint.arb.pi()).sqrt()
    c = flint.arb(flint.fmpq(44715, 10**6))
    t = (root * (x + c * x**3)).tanh()
    return (1 + t) / 2 + x * (1 - t**2) * root * (1 + 3 * c * x**2) / 2


def _sigmoid(x):
    return 1 / (1 + (-x).exp())


def _elu1(x):
    if x > 0:
        return x + 1
    if x <= 0:
        return x.exp()
    return (x + 1).union(x.exp())  # a ball around 0: both branches (they meet at 0 with slope 1)


ARB_ACTIVATIONS = {
    **ARB,  # GELU (both forms) and SiLU, as the forward pass computes them
    "elu1": _elu1,
    "identity": lambda x: x,
    "relu": _relu,
    "relu2": lambda x: _relu(x) ** 2,
    "d:relu": _step,
    "d:relu2": lambda x: 2 * _relu(x),
    "d:gelu": lambda x: (1 + (x / flint.arb(2).sqrt()).erf()) / 2 + x * (-x**2 / 2).exp() / (2 * flint.arb.pi()).sqrt(),
    "d:gelu-tanh": _gelu_tanh_slope,
    "d:silu": lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
}
