"""SymPy's private internals, in one place.

The exact fast paths reach below SymPy's public API: a matrix held as a python-flint
``fmpq_mat`` without a SymPy number per entry (``ImmutableDenseMatrix._fromrep``,
``_rep``, ``_args``, ``_mhash``, ``_assumptions``, ``sympy.polys.matrices._dfm.DFM``,
``DomainMatrix.rep``), sums and products built without SymPy's canonicalising pass
(``Add._from_args``, ``Mul._from_args``, ``sympy.core.add._addsort``) and ``_to_mpmath``.
None of these is promised to stay as it is from one SymPy release to the next, so this
module is the only one that touches them (``tests/test_architecture.py`` checks that);
everything else calls the small functions below. ``pyproject.toml`` bounds sympy to the
releases the tests have passed with, and CI (``.ci/run``) also runs the tests against the
newest SymPy release, so a release that changes these internals turns CI red instead of
changing an output.

Nothing here imports another symattn module.
"""

from __future__ import annotations

import flint
import sympy
from sympy import QQ
from sympy.polys.matrices import DomainMatrix

# Whether SymPy's QQ numbers are flint's fmpq (its flint ground types): then an fmpq_mat can
# be handed to SymPy as it is. Under SymPy's python ground types (SYMPY_GROUND_TYPES=python,
# or a SymPy older than 1.13) they are not, and rational matrices are DomainMatrix objects of
# SymPy's own.
FLINT_QQ = QQ.of_type(flint.fmpq(0))


# -- rational matrices ------------------------------------------------------------------
#
# A matrix of rationals is a SymPy ImmutableMatrix whose internal representation is a
# DomainMatrix over QQ (python-flint's fmpq_mat when SymPy uses flint as its ground
# types). Products, transposes and rational scalings stay in that representation, so
# no per-entry SymPy arithmetic happens; entries become SymPy numbers only when shown.


class QQMatrix(sympy.ImmutableDenseMatrix):
    """An ImmutableMatrix of rationals that makes SymPy numbers only when asked for.

    SymPy's ImmutableMatrix turns every entry into a SymPy number as it is built (its
    ``args``): a second for a model-sized head. This one holds a dense QQ DomainMatrix
    (python-flint's ``fmpq_mat``) and builds its ``args`` and SymPy's sparse internal form
    on first use, so a matrix that is only multiplied, rounded and shown by its corners
    never builds them. It is an ImmutableMatrix in every other respect (``==``, hashing,
    arithmetic, printing).
    """

    @classmethod
    def _fromrep(cls, rep):
        if not (rep.domain.is_QQ or rep.domain.is_ZZ):
            return sympy.ImmutableDenseMatrix._fromrep(rep)
        obj = object.__new__(cls)
        obj._assumptions = cls.default_assumptions
        obj._mhash = None
        obj._rows, obj._cols = rep.shape
        if rep.rep.fmt == "sparse":
            obj.__dict__["_sparse"] = rep
        else:
            obj.__dict__["_dense"] = rep
        return obj

    @property
    def _rep(self):
        """SymPy's internal form (a sparse DomainMatrix), built on first use."""
        d = self.__dict__
        if "_sparse" not in d:
            d["_sparse"] = self.dense.to_sparse()
        return d["_sparse"]

    @_rep.setter
    def _rep(self, rep) -> None:
        self.__dict__["_sparse"] = rep

    @property
    def _args(self):
        d = self.__dict__
        if "_built_args" not in d:
            flat = self._rep.to_sympy().to_list_flat()
            d["_built_args"] = (sympy.Integer(self._rows), sympy.Integer(self._cols), sympy.Tuple(*flat, sympify=False))
        return d["_built_args"]

    @_args.setter
    def _args(self, args) -> None:
        self.__dict__["_built_args"] = args

    @property
    def dense(self):
        """The entries as a dense QQ DomainMatrix (``fmpq_mat`` under flint)."""
        d = self.__dict__
        if "_dense" not in d and "_deferred" in d:  # made whole now (see deferred_matrix)
            d["_dense"] = d["_deferred"].dense()
        if "_dense" not in d:
            rep = d["_sparse"]
            d["_dense"] = (rep if rep.domain.is_QQ else rep.convert_to(QQ)).to_dense()
        if not d["_dense"].domain.is_QQ:
            d["_dense"] = d["_dense"].convert_to(QQ)
        return d["_dense"]

    def __hash__(self) -> int:
        # As an ImmutableDenseMatrix with the same entries hashes (they compare equal).
        if self._mhash is None:
            self._mhash = hash(("ImmutableDenseMatrix",) + self._hashable_content())
        return self._mhash

    def __getitem__(self, key):
        # An entry, a row or a column straight from the dense form; anything else as SymPy does it.
        rows, cols = self._rows, self._cols
        if type(key) is int and -rows * cols <= key < rows * cols:
            key = divmod(key % (rows * cols), cols)
        if type(key) is tuple and len(key) == 2:
            i, j = key
            deferred = self.__dict__.get("_deferred") if "_dense" not in self.__dict__ else None
            if type(i) is int and type(j) is int:
                if -rows <= i < rows and -cols <= j < cols:
                    if deferred is not None:
                        p, q = deferred.entry(i % rows, j % cols)
                    else:
                        x = self.dense.rep.getitem(i % rows, j % cols)
                        p, q = int(x.numerator), int(x.denominator)
                    return sympy.Integer(p) if q == 1 else sympy.Rational(p, q)
            elif type(i) in (int, slice) and type(j) in (int, slice):
                i, j = _as_slice(i, rows), _as_slice(j, cols)
                if i is not None and j is not None:
                    return deferred.part(i, j) if deferred is not None else matrix_from_domain(self.dense[i, j])
        return super().__getitem__(key)


def _as_slice(k: "int | slice", n: int) -> "slice | None":
    """``k`` as a non-empty slice of range(n) with step 1, or None (left to SymPy)."""
    if type(k) is int:
        return slice(k % n, k % n + 1) if -n <= k < n else None
    start, stop, step = k.indices(n)
    return slice(start, stop) if step == 1 and start < stop else None


def matrix_from_domain(dm) -> sympy.ImmutableDenseMatrix:
    """A :class:`QQMatrix` holding the QQ (or ZZ) DomainMatrix ``dm`` (its SymPy numbers built
    when read); SymPy's own ImmutableMatrix for any other domain."""
    return QQMatrix._fromrep(dm)


def matrix_from_fmpq_mat(dense) -> QQMatrix:
    """A :class:`QQMatrix` holding flint's ``fmpq_mat`` ``dense`` as it is (needs ``FLINT_QQ``)."""
    from sympy.polys.matrices._dfm import DFM

    return matrix_from_domain(DomainMatrix.from_rep(DFM(dense, (dense.nrows(), dense.ncols()), QQ)))


def deferred_matrix(rows: int, cols: int, source) -> QQMatrix:
    """A :class:`QQMatrix` of ``rows × cols`` rationals whose dense QQ DomainMatrix is made by
    ``source.dense()`` only when an operation needs it whole; until then an entry is
    ``source.entry(i, j)`` (its numerator and denominator) and a block of rows and columns
    ``source.part(rows, cols)`` (slices): a model's embedding table, of which a derivation reads
    a few entries and products that need no fmpq_mat, is never made one."""
    obj = object.__new__(QQMatrix)
    obj._assumptions = QQMatrix.default_assumptions
    obj._mhash = None
    obj._rows, obj._cols = rows, cols
    obj.__dict__["_deferred"] = source
    return obj


def deferred_source(m):
    """The source of a :func:`deferred_matrix` not yet made whole, else None."""
    d = getattr(m, "__dict__", None)
    return d["_deferred"] if isinstance(m, QQMatrix) and "_deferred" in d and "_dense" not in d else None


def is_rational_matrix(m) -> bool:
    """Whether ``m`` is a matrix of rationals held as a DomainMatrix (cheap: no entry is read)."""
    if isinstance(m, QQMatrix):
        return True
    rep = getattr(m, "_rep", None)
    return rep is not None and (rep.domain == QQ or rep.domain == sympy.ZZ)


def qq_dense(m):
    """The entries of a rational matrix (see :func:`is_rational_matrix`) as a dense QQ
    DomainMatrix (``fmpq_mat`` under flint)."""
    if isinstance(m, QQMatrix):
        return m.dense
    rep = m._rep
    if rep.domain != QQ:
        rep = rep.convert_to(QQ)
    return rep.to_dense()


def flint_matrix(dm):
    """The python-flint matrix a DomainMatrix holds (an ``fmpq_mat`` for a dense QQ one under
    flint ground types), or None when it holds none."""
    return getattr(dm.rep, "rep", None) if type(dm.rep).__name__ == "DFM" else None


# -- expressions built as SymPy would, without its canonicalising pass ---------------------


def mul_in_order(coefficient, power) -> sympy.Expr:
    """The product ``coefficient·power`` (a rational ≠ 0, 1 and a power such as ``e^x``) as
    SymPy builds it (coefficient first), without its flattening pass."""
    return sympy.Mul._from_args((coefficient, power))


def product_of_two(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """``a·b`` as SymPy builds it, without its flattening pass, for factors that do not combine:
    ``a`` an ``e^x`` or a sum, ``b`` a power of another base (``Z^{-1}``); else SymPy's own product."""
    from sympy.core.mul import _mulsort

    if not (isinstance(a, (sympy.exp, sympy.Add)) and isinstance(b, sympy.Pow) and not isinstance(b.base, sympy.Mul)) \
            or a == b.base:  # Z·Z^{-1}: SymPy's product is 1
        return sympy.Mul(a, b)
    args = [a, b]
    _mulsort(args)  # the order Mul's flattening sorts its factors in
    return sympy.Mul._from_args(args)


def product_of_distinct(coefficient: sympy.Rational, factors: list) -> sympy.Expr:
    """``coefficient·f_1···f_k`` as SymPy builds it, for a rational ≠ 0 and factors of distinct
    kinds that do not combine (a square root of an integer, a cosine or a sine): the factors in
    the order Mul's flattening sorts them, the coefficient first unless it is 1."""
    from sympy.core.mul import _mulsort

    factors = list(factors)
    if not factors:
        return coefficient
    if coefficient == 1 and len(factors) == 1:
        return factors[0]
    _mulsort(factors)
    return sympy.Mul._from_args(tuple(factors) if coefficient == 1 else (coefficient, *factors))


def sum_of_distinct(terms: list) -> sympy.Expr:
    """``sympy.Add(*terms)`` for terms that are already collected (no two alike, at most one
    number): the same canonical sum, without Add's pass that splits and rebuilds every term."""
    from sympy.core.add import _addsort

    numbers = [t for t in terms if t.is_Number]
    others = [t for t in terms if not t.is_Number]
    if len(numbers) > 1 or not all(isinstance(t, (sympy.Mul, sympy.exp, sympy.cos, sympy.sin)) for t in others):
        return sympy.Add(*terms)
    _addsort(others)
    args = numbers + others
    if not args:
        return sympy.Integer(0)
    return args[0] if len(args) == 1 else sympy.Add._from_args(args)


def to_mpmath(value: sympy.Expr, prec: int):
    """A number SymPy has evaluated (``sympy.N``) as an mpmath number with ``prec`` bits."""
    return value._to_mpmath(prec)


# -- SymPy's canonical order of a sum's terms, for text written without building the sum ----

# Where Basic.compare puts a rational number's class (SymPy's ``ordering_of_classes``):
# 0, 1, 1/2 and −1 are singleton classes of their own, before every other Integer, then Rational.
_ZERO, _ONE, _HALF, _NEGATIVE_ONE, _INTEGER, _RATIONAL = 0, 1, 2, 5, 7, 8


def rational_order_key(p: int, q: int) -> tuple[int, int, int]:
    """The key that sorts SymPy's Rational ``p/q`` (in lowest terms, ``q > 0``) as
    ``Basic.compare`` does: by class in ``ordering_of_classes``, then by ``(p, q)``."""
    if q == 1:
        cls = _ZERO if p == 0 else _ONE if p == 1 else _NEGATIVE_ONE if p == -1 else _INTEGER
    else:
        cls = _HALF if p == 1 and q == 2 else _RATIONAL
    return (cls, p, q)


def exp_term_order_key(c: tuple[int, int], x: tuple[int, int]) -> tuple:
    """The key that sorts the term ``c·e^x`` (rationals ``c ≠ 0`` and ``x ≠ 0`` as ``(p, q)`` in
    lowest terms) among the non-number terms of a sum as SymPy's ``Add`` orders its args
    (``_addsort``, by ``Basic.compare``): each product ``c·e^x`` (a Mul: Mul comes before the
    function ``exp``, which is not in ``ordering_of_classes``) by c, then x; then each ``e^x``
    (c = 1) by x. :func:`sum_of_distinct` is what these keys stand for."""
    if c == (1, 1):
        return (1, rational_order_key(*x))
    return (0, rational_order_key(*c), rational_order_key(*x))
