"""Marking a hand calculation: stage by stage, entry by entry, with diagnosis.

An answers file is a YAML mapping from stage ids (``Q``, ``S_scaled``, ``A``,
``head1.A``, ...) to matrices. Each entry is either

* **exact**: an integer, a fraction or an expression (``"1/3"``,
  ``"e^(1/2)/(1 + e^(1/2))"``, ``"-inf"``), which must equal the exact value; or
* **a rounded decimal** (``0.4231``), which is right when it is the exact value
  rounded to the places written: within half a unit in the last written place.

Each stage is also compared with the same stage computed from the student's
*own* earlier answers (follow-through marking): one early slip is marked once.
Those comparisons allow, besides half a unit in the answer's last place, the
rounding carried in from the earlier answers: two units in the last place of
the coarsest earlier answer used, times the size of the value (at least 1).
``tolerance`` replaces both rules with one absolute tolerance.

A wrong stage is tested against the common mistakes, and the one that
reproduces the answer is named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import mpmath
import sympy
import yaml

from . import _yaml
from ._errors import SymattnError
from ._exact import softmax_backward
from ._numbers import NumberError, parse_number
from .derivation import Derivation

DPS = 30
MAX_WRONG_SHOWN = 5
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?\Z")
_E = {"e": sympy.E}
NINF = mpmath.ninf

Grid = list[list[mpmath.mpf]]


@dataclass(frozen=True)
class Entry:
    """One answer entry: its text, exact value, and the half-unit of its last written place (None if exact)."""

    text: str
    value: sympy.Expr
    half_unit: mpmath.mpf | None

    @cached_property
    def approx(self) -> mpmath.mpf:
        return _mp(self.value)


@dataclass(frozen=True)
class Answer:
    """A student's matrix for one stage."""

    id: str
    entries: tuple[tuple[Entry, ...], ...]
    line: int

    @cached_property
    def values(self) -> Grid:  # computed once: marking compares it with many candidates
        return [[e.approx for e in row] for row in self.entries]

    @property
    def coarsest(self) -> mpmath.mpf:
        """The largest half-unit among the entries (0 when all are exact)."""
        units = [e.half_unit for row in self.entries for e in row if e.half_unit is not None]
        return max(units, default=mpmath.mpf(0))


@dataclass(frozen=True)
class WrongEntry:
    row: int
    col: int
    given: str
    expected: str
    expected_approx: float | None


@dataclass(frozen=True)
class StageMark:
    """The verdict on one stage: ``right``, ``wrong`` or ``follows`` (error carried forward)."""

    id: str
    status: str
    wrong: tuple[WrongEntry, ...] = ()
    wrong_count: int = 0
    diagnosis: str | None = None
    note: str | None = None

    def as_dict(self) -> dict:
        out: dict = {"id": self.id, "status": self.status}
        if self.wrong:
            out["wrong"] = [
                {"row": w.row, "col": w.col, "given": w.given, "expected": w.expected, "expected_approx": w.expected_approx}
                for w in self.wrong
            ]
            out["wrong_count"] = self.wrong_count
        if self.diagnosis:
            out["diagnosis"] = self.diagnosis
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class Marking:
    """The marking of one answers file."""

    source: str
    stages: tuple[StageMark, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return all(s.status == "right" for s in self.stages)

    def as_dict(self) -> dict:
        return {"passed": self.passed, "stages": [s.as_dict() for s in self.stages]}


# -- reading answers ----------------------------------------------------------------


def load_answers(path: str | Path, derivation: Derivation) -> dict[str, Answer]:
    """Read and validate an answers file against the derivation's stages."""
    name = str(path)
    try:
        text = Path(path).read_text("utf-8-sig")
    except FileNotFoundError:
        raise SymattnError("no such file", file=name) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SymattnError(f"cannot read the file: {exc}", file=name) from None
    return parse_answers(text, name, derivation)


def parse_answers(text: str, name: str, derivation: Derivation) -> dict[str, Answer]:
    root = _yaml.compose(text, name)
    if root is None or _yaml.is_null(root):
        raise SymattnError("the answers file is empty; write stage ids with your matrices, e.g. S: [[1, 2], [3, 4]]", file=name)
    _yaml.check_tags(root, name)
    if not isinstance(root, yaml.MappingNode):
        raise _yaml.where(name, root).error(f"an answers file is a mapping of stage ids to matrices, not {_yaml.kind(root)}")
    ids = [s.id for s in derivation.steps if not s.given]
    out: dict[str, Answer] = {}
    for key, node in root.value:
        where = _yaml.where(name, key)
        stage = getattr(key, "value", None)
        if stage not in ids and derivation.problem.backward is None and str(stage).rsplit(".", 1)[-1] in _GRADIENTS:
            raise where.error(
                f"{stage} is a gradient of the backward pass, which this problem does not derive; "
                "add a backward: section to the problem or mark with --backward"
            )
        if stage not in ids:
            import difflib

            close = difflib.get_close_matches(str(stage), ids, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise where.error(f"{stage!r} is not a computed stage of this problem{hint}; the stages are {', '.join(ids)}")
        if stage in out:
            raise where.error(f"{stage} is answered twice")
        out[stage] = _read_matrix(name, stage, node, derivation.step(stage).shape, key.start_mark.line + 1)
    if not out:
        raise SymattnError("the answers file has no answers", file=name)
    return out


def _read_matrix(name: str, stage: str, node, shape: tuple[int, int], line: int) -> Answer:
    where = _yaml.where(name, node)
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise where.error(f"an answer is a matrix written as a list of rows, not {_yaml.kind(node)}", stage)
    rows, cols = shape
    if len(node.value) != rows:
        raise where.error(f"{stage} is {rows}×{cols} but the answer has {len(node.value)} rows", stage)
    entries = []
    for i, row in enumerate(node.value):
        if not isinstance(row, yaml.SequenceNode) or len(row.value) != cols:
            n = len(row.value) if isinstance(row, yaml.SequenceNode) else "no"
            raise _yaml.where(name, row).error(f"{stage} has {cols} columns but this row has {n} entries", f"{stage}[{i}]")
        entries.append(tuple(_read_entry(name, f"{stage}[{i}][{j}]", e) for j, e in enumerate(row.value)))
    return Answer(stage, tuple(entries), line)


def _read_entry(name: str, field_name: str, node) -> Entry:
    where = _yaml.where(name, node)
    if not isinstance(node, yaml.ScalarNode) or _yaml.is_null(node) or _yaml.is_bool(node):
        raise where.error(f"expected a number, not {_yaml.kind(node)}", field_name)
    text = node.value.strip()
    try:
        value = parse_number(text, symbols=_E, allow_neg_inf=True)
    except NumberError as exc:
        raise where.error(str(exc), field_name) from None
    if value.free_symbols:
        raise where.error(f"{text!r} is not a number", field_name)
    half = None
    if _DECIMAL.match(text):
        mantissa, _, exponent = text.lower().partition("e")
        places = len(mantissa.partition(".")[2]) - (int(exponent) if exponent else 0)
        half = mpmath.mpf(10) ** (-places) / 2
    return Entry(text, value, half)


# -- numbers --------------------------------------------------------------------------


def _mp(x: sympy.Expr) -> mpmath.mpf:
    from ._exact import to_mpf

    with mpmath.workdps(DPS + 10):
        return to_mpf(x, DPS)


def _matmul(a: Grid, b: Grid) -> Grid:
    with mpmath.workdps(DPS + 10):
        return [[mpmath.fsum(x * row[j] for x, row in zip(r, b)) for j in range(len(b[0]))] for r in a]


def _t(a: Grid) -> Grid:
    return [list(col) for col in zip(*a)]


def _softmax_rows(z: Grid) -> Grid:
    with mpmath.workdps(DPS + 10):
        out = []
        for row in z:
            finite = [v for v in row if v != NINF]
            if not finite:
                return None  # a row with nothing allowed: no softmax
            m = max(finite)
            e = [mpmath.mpf(0) if v == NINF else mpmath.exp(v - m) for v in row]
            total = mpmath.fsum(e)
            out.append([x / total for x in e])
        return out


def _exact_grid(m) -> Grid:
    from ._exact import evaluate

    return evaluate(m, DPS)


def _same_shape(a: Grid | None, b: Grid) -> bool:
    return a is not None and len(a) == len(b) and len(a[0]) == len(b[0])


# -- marking ------------------------------------------------------------------------------

_GRADIENTS = {"dO", "dW_O", "dconcat", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V", "dX", "dcontext"}


def mark(derivation: Derivation, answers: dict[str, Answer], tolerance: float | None = None, source: str = "") -> Marking:
    """Mark every answered stage, in the derivation's order."""
    if not derivation.can_evaluate:
        raise SymattnError("the problem has symbols without values; give values to check answers against it")
    marker = _Marker(derivation, answers, tolerance)
    return Marking(source, tuple(marker.stage(step.id) for step in derivation.steps if step.id in answers))


class _Marker:
    def __init__(self, d: Derivation, answers: dict[str, Answer], tolerance: float | None) -> None:
        self.d = d
        self.answers = answers
        self.tolerance = None if tolerance is None else mpmath.mpf(tolerance)

    def carried(self, id: str) -> tuple[Grid | None, frozenset[str]]:
        """A stage as the student's answers make it: their answer where given, else computed
        from their own answers further back (through stages they skipped), else exact; with
        the answered stages it rests on."""
        cache = self.__dict__.setdefault("_carried", {})
        if id not in cache:
            if id in self.answers:
                cache[id] = (self.answers[id].values, frozenset([id]))
            else:
                grid, used = self.follow_through(id)
                cache[id] = (grid, used) if used and grid is not None else (self.exact(id), frozenset())
        return cache[id]

    def exact(self, id: str) -> Grid:
        return self.d.evaluate(id, DPS)

    def matches(self, answer: Answer, target: Grid | None, slack: mpmath.mpf = mpmath.mpf(0)) -> list[tuple[int, int]]:
        """The entries of ``answer`` that do not match ``target`` (all of them if shapes differ)."""
        rows, cols = len(answer.entries), len(answer.entries[0])
        if not _same_shape(target, answer.values):
            return [(i, j) for i in range(rows) for j in range(cols)]
        bad = []
        for i, row in enumerate(answer.entries):
            for j, entry in enumerate(row):
                if not self.entry_matches(entry, target[i][j], slack):
                    bad.append((i, j))
        return bad

    def entry_matches(self, entry: Entry, want: mpmath.mpf, slack: mpmath.mpf) -> bool:
        got = entry.approx
        if want == NINF or got == NINF:
            return want == got
        with mpmath.workdps(DPS + 10):
            error = abs(got - want)
            if self.tolerance is not None:
                return error <= self.tolerance
            if entry.half_unit is None and slack == 0:
                # an exact answer must be equal: equal to 25 digits, then exactly where it can be decided
                return error <= mpmath.mpf(10) ** (-25) * max(1, abs(want))
            limit = (entry.half_unit or 0) + slack * max(1, abs(want))
            return error <= limit * (1 + mpmath.mpf(10) ** -20)

    # -- one stage ---------------------------------------------------------------------

    def stage(self, id: str) -> StageMark:
        answer = self.answers[id]
        exact = self.exact(id)
        wrong = self.matches(answer, exact)
        if not wrong:
            return StageMark(id, "right")
        follow, used = self.follow_through(id)
        # only an earlier answer that is itself not right can carry an error forward
        carriers = sorted(u for u in used if self.matches(self.answers[u], self.exact(u)))
        if follow is not None and carriers:
            slack = 4 * max(self.answers[u].coarsest for u in used)
            if not self.matches(answer, follow, slack):
                return StageMark(id, "follows", note=f"right when computed from your {', '.join(carriers)}")
        step = self.d.step(id)
        shown = []
        for i, j in wrong[:MAX_WRONG_SHOWN]:
            value = step.lazy[i, j]
            shown.append(
                WrongEntry(
                    i, j, answer.entries[i][j].text,
                    "-oo" if value == sympy.S.NegativeInfinity else sympy.sstr(value, order="none"),
                    None if exact[i][j] == NINF else float(exact[i][j]),
                )
            )
        return StageMark(id, "wrong", tuple(shown), len(wrong), self.diagnose(id, answer, exact, wrong))

    def follow_through(self, id: str) -> tuple[Grid | None, frozenset[str]]:
        """The stage computed from the student's own earlier answers, and which answers it rests on."""
        step = self.d.step(id)
        prefix = id[: -len(step.kind)]
        kind = step.kind
        p = self.d.problem
        multi_final = p.multi_head and step.head is None
        deps = {
            "K_T": ["K"], "S": ["Q", "K_T"], "S_scaled": ["S"], "S_masked": ["S_scaled", "M"],
            "A": ["S_masked"], "O": ["A", "V"],
            "dV": ["A", "dO"], "dA": ["dO", "V"], "dS_masked": ["A", "dA"], "dS": ["dS_masked"],
            "dQ": ["dS", "K"], "dK": ["dS", "Q"], "dW_Q": ["dQ"], "dW_K": ["dK"], "dW_V": ["dV"],
        }.get(kind, [])
        if kind == "concat":
            ids = [f"head{h}.O" for h in range(1, len(p.heads) + 1)]
        elif multi_final and kind == "O":
            ids = ["concat"]
        elif kind == "dO":
            ids = ["dconcat"] if step.head else ["O"] if p.backward.kind == "target" else []
        elif kind in ("dW_O", "dconcat"):
            ids = ["concat", "dO"] if kind == "dW_O" else ["dO"]
        elif kind in ("dX", "dcontext"):
            return self._input_gradient(kind)
        else:
            ids = [prefix + d for d in deps]
        carried = {d: self.carried(d) for d in ids}
        used = frozenset().union(*(u for _, u in carried.values())) if carried else frozenset()
        v = {d.rsplit(".", 1)[-1] if not d.startswith("head") or kind != "concat" else d: g for d, (g, _) in carried.items()}
        if any(g is None for g in v.values()):
            return None, used
        try:
            if kind == "concat":
                return [sum((v[d][i] for d in ids), []) for i in range(p.n_q)], used
            if kind == "K_T":
                return _t(v["K"]), used
            if kind == "S":
                return _matmul(v["Q"], v["K_T"]), used
            if kind == "S_scaled":
                factor = _mp(p.scale_for(len(self.exact(prefix + "Q")[0])))
                return [[x * factor for x in row] for row in v["S"]], used
            if kind == "S_masked":
                return [[NINF if b == NINF else a + b for a, b in zip(r1, r2)] for r1, r2 in zip(v["S_scaled"], v["M"])], used
            if kind == "A":
                return _softmax_rows(v["S_masked"]), used
            if kind == "O":
                if multi_final:
                    return _matmul(v["concat"], self.exact("W_O")), used
                return _matmul(v["A"], v["V"]), used
            if kind in _GRADIENTS:
                return self._gradient(kind, prefix, v, step), used
        except (ValueError, IndexError, TypeError, ZeroDivisionError):
            return None, used
        return None, frozenset()

    def _gradient(self, kind: str, prefix: str, v: dict, step) -> Grid | None:
        """A gradient stage from the student's own earlier stages ``v``, by its relation."""
        p = self.d.problem
        if kind == "dO":
            if step.head:  # this head's block of columns of d(concat)
                start = sum(len(self.exact(f"head{h}.V")[0]) for h in range(1, step.head))
                width = len(self.exact(prefix + "V")[0])
                return [row[start:start + width] for row in v["dconcat"]]
            if p.backward.kind != "target":
                return None  # given, or fixed by the loss: nothing earlier to carry
            target = _exact_grid(p.backward.matrix)
            with mpmath.workdps(DPS + 10):
                return [[o - t for o, t in zip(ro, rt)] for ro, rt in zip(v["O"], target)]
        if kind == "dW_O":
            return _matmul(_t(v["concat"]), v["dO"])
        if kind == "dconcat":
            return _matmul(v["dO"], _t(self.exact("W_O")))
        if kind == "dV":
            return _matmul(_t(v["A"]), v["dO"])
        if kind == "dA":
            return _matmul(v["dO"], _t(v["V"]))
        if kind == "dS_masked":
            return softmax_backward(v["A"], v["dA"], DPS)
        if kind == "dS":
            factor = _mp(p.scale_for(len(self.exact(prefix + "Q")[0])))
            with mpmath.workdps(DPS + 10):
                return [[x * factor for x in row] for row in v["dS_masked"]]
        if kind == "dQ":
            return _matmul(v["dS"], v["K"])
        if kind == "dK":
            return _matmul(_t(v["dS"]), v["Q"])
        inputs = {"dW_Q": "X", "dW_K": "kv", "dW_V": "kv"}
        if kind in inputs:
            source = "context" if inputs[kind] == "kv" and p.context is not None else "X"
            return _matmul(_t(self.exact(source)), v["d" + kind[-1]])
        return None

    def _input_gradient(self, kind: str) -> tuple[Grid | None, frozenset[str]]:
        """dX or dcontext: the sum over heads of each path's gradient times its weights, transposed."""
        p = self.d.problem
        prefixes = [f"head{h}." for h in range(1, len(p.heads) + 1)] if p.multi_head else [""]
        paths = ["dK", "dV"] if kind == "dcontext" else ["dQ"] if p.context is not None else ["dQ", "dK", "dV"]
        total, used = None, frozenset()
        for pre in prefixes:
            for g in paths:
                grid, u = self.carried(pre + g)
                if grid is None:
                    return None, used
                used |= u
                part = _matmul(grid, _t(self.exact(pre + "W_" + g[-1])))
                with mpmath.workdps(DPS + 10):
                    total = part if total is None else [[x + y for x, y in zip(r, s)] for r, s in zip(total, part)]
        return total, used

    # -- diagnosis --------------------------------------------------------------------

    def diagnose(self, id: str, answer: Answer, exact: Grid, wrong: list[tuple[int, int]]) -> str | None:
        step = self.d.step(id)
        kind = step.kind
        prefix = id[: -len(kind)]
        slack = 4 * max([answer.coarsest] + [self.answers[a].coarsest for a in self.answers])
        for name, candidate in self.mistakes(kind, prefix):
            if candidate is not None and not self.matches(answer, candidate, slack):
                return name
        if len(wrong) == 1:
            i, j = wrong[0]
            given = answer.entries[i][j]
            off = given.approx - exact[i][j] if exact[i][j] != NINF and given.approx != NINF else None
            label = f"{id}[{i}][{j}]"
            if off is not None and given.half_unit is None and abs(off - round(off)) < 1e-20 and abs(off) <= 2:
                return f"arithmetic slip: {label} is off by {int(round(off)):+d}; everything else is right"
            return f"a single wrong entry: {label}; everything else is right"
        if step.kind in ("Q", "K", "V", "S", "K_T") and all(
            answer.entries[i][j].approx != NINF
            and exact[i][j] != NINF
            and abs(abs(answer.entries[i][j].approx - exact[i][j]) - 1) < 1e-20
            for i, j in wrong
        ) and len(wrong) <= 3:
            places = ", ".join(f"{id}[{i}][{j}]" for i, j in wrong)
            return f"arithmetic slips: {places} are each off by 1"
        return None

    def mistakes(self, kind: str, prefix: str):
        """(name, matrix) for each common mistake that can be computed for this stage."""
        p = self.d.problem
        ex = lambda k: self.exact(prefix + k)  # noqa: E731
        if p.multi_head and not prefix and kind in ("O", "concat"):
            yield "the product's rows and columns are swapped (the answer is the transpose)", _t(self.exact(kind))
            return
        if kind in _GRADIENTS:
            try:
                yield from self._gradient_mistakes(kind, ex)
            except (ValueError, IndexError, TypeError, ZeroDivisionError, KeyError):
                pass
            return
        try:
            if kind in ("Q", "K", "V"):
                yield "the product's rows and columns are swapped (the answer is the transpose)", _t(ex(kind))
            if kind == "S":
                Q, K = ex("Q"), ex("K")
                yield "K·Qᵀ instead of Q·Kᵀ (the scores are transposed)", _matmul(K, _t(Q))
                if len(Q[0]) == len(K):
                    yield "Q·K instead of Q·Kᵀ (K was not transposed)", _matmul(Q, K)
            d_k = len(ex("Q")[0]) if (prefix + "Q") in self.d.ids else p.d_k
            S, M = ex("S"), ex("M") if kind in ("S_scaled", "S_masked", "A", "O") else None
            scaled_dk = [[x / d_k for x in row] for row in S] if kind != "S" else None
            if kind == "S_scaled":
                yield "no scaling: the scores were not divided by √d_k", S
                yield "scaled by d_k instead of √d_k", scaled_dk
            if kind in ("S_masked", "A", "O"):
                plus = lambda a, b: [[NINF if y == NINF else x + y for x, y in zip(r, s)] for r, s in zip(a, b)]  # noqa: E731
                variants = {
                    "no scaling: the scores were not divided by √d_k": plus(S, M),
                    "scaled by d_k instead of √d_k": plus(scaled_dk, M),
                    "mask missing: the masked positions were not set to −∞": ex("S_scaled"),
                }
                for name, z in variants.items():
                    if kind == "S_masked":
                        if name.startswith("mask missing"):
                            yield name, z
                        continue
                    a = _softmax_rows(z)
                    yield (name, a) if kind == "A" else (name, self._out(prefix, a))
                if kind in ("A", "O"):
                    after = _softmax_rows(ex("S_scaled"))
                    masked_after = [[mpmath.mpf(0) if m == NINF else x for x, m in zip(r, mr)] for r, mr in zip(after, M)]
                    name = "mask applied after the softmax (masked weights zeroed, rows not renormalised)"
                    yield (name, masked_after) if kind == "A" else (name, self._out(prefix, masked_after))
                    Z = ex("S_masked")
                    if self._columns_ok(Z):
                        columns = _t(_softmax_rows(_t(Z)))
                        name = "softmax taken over columns instead of rows"
                        yield (name, columns) if kind == "A" else (name, self._out(prefix, columns))
                if kind == "O":
                    A, V = ex("A"), ex("V")
                    if len(A) == len(A[0]):
                        yield "Aᵀ·V instead of A·V (the weights were transposed)", _matmul(_t(A), V)
                    yield "the product's rows and columns are swapped (the answer is the transpose)", _t(ex("O"))
        except (ValueError, IndexError, TypeError, ZeroDivisionError, KeyError):
            return

    def _gradient_mistakes(self, kind: str, ex):
        """The classic slips of backpropagation through attention."""
        square = lambda m: len(m) == len(m[0])  # noqa: E731
        if kind == "dS_masked":
            A, dA = ex("A"), ex("dA")
            with mpmath.workdps(DPS + 10):
                diagonal = [[a * (1 - a) * g for a, g in zip(ra, rg)] for ra, rg in zip(A, dA)]
            yield ("Jacobian diagonal only: a_ij(1 − a_ij)·dA_ij drops the off-diagonal terms −a_ij·a_ik "
                   "(each weight also depends on the other scores of its row)"), diagonal
        if kind == "dS":
            yield "the scale factor is missing: dS = dŜ, but the scores were scaled before the softmax", ex("dS_masked")
        if kind in ("dQ", "dK"):
            unscaled = ex("dS_masked")
            other = ex("K") if kind == "dQ" else ex("Q")
            product = _matmul(unscaled, other) if kind == "dQ" else _matmul(_t(unscaled), other)
            yield "the scale factor is missing: dŜ was used instead of dS = scale·dŜ", product
        if kind == "dV" and square(ex("A")):
            yield "A·dO instead of Aᵀ·dO (the weights were not transposed)", _matmul(ex("A"), ex("dO"))
        if kind == "dK" and square(ex("dS")):
            yield "dS·Q instead of dSᵀ·Q (dS was not transposed)", _matmul(ex("dS"), ex("Q"))
        if kind == "dQ" and square(ex("dS")):
            yield "dSᵀ·K instead of dS·K (dS was transposed)", _matmul(_t(ex("dS")), ex("K"))
        if kind == "dA":
            V, dO = ex("V"), ex("dO")
            if len(V) == len(dO[0]) and len(V[0]) == len(dO):
                yield "dO·V instead of dO·Vᵀ (V was not transposed)", _matmul(dO, V)
        if kind in ("dW_Q", "dW_K", "dW_V", "dA", "dQ", "dK", "dV", "dS_masked", "dS", "dX", "dW_O", "dconcat"):
            exact = ex(kind)
            if square(exact):
                yield "the product's rows and columns are swapped (the answer is the transpose)", _t(exact)

    def _out(self, prefix: str, A: Grid | None) -> Grid | None:
        if A is None:
            return None
        return _matmul(A, self.exact(prefix + "V"))

    @staticmethod
    def _columns_ok(z: Grid) -> bool:
        return all(any(v != NINF for v in col) for col in _t(z))


# -- reports --------------------------------------------------------------------------------


def _approx(w: WrongEntry) -> str:
    """`` ≈ 0.4231`` after an expected value that is not a plain number already."""
    if w.expected_approx is None or re.fullmatch(r"-?[0-9]+", w.expected):
        return ""
    return f" ≈ {w.expected_approx:.6g}"


def report_text(m: Marking) -> str:
    lines = []
    for s in m.stages:
        mark_ = {"right": "✓", "follows": "✓ (follows)", "wrong": "✗"}[s.status]
        line = f"{mark_} {s.id}"
        if s.note:
            line += f": {s.note}"
        if s.status == "wrong":
            line += f": {s.wrong_count} wrong " + ("entry" if s.wrong_count == 1 else "entries")
        lines.append(line)
        for w in s.wrong:
            lines.append(f"    [{w.row}][{w.col}]: you wrote {w.given}, expected {w.expected}{_approx(w)}")
        if s.wrong_count > len(s.wrong):
            lines.append(f"    ... and {s.wrong_count - len(s.wrong)} more")
        if s.diagnosis:
            lines.append(f"    likely cause: {s.diagnosis}")
    count = {k: sum(s.status == k for s in m.stages) for k in ("right", "follows", "wrong")}
    summary = f"{count['right']} of {len(m.stages)} stages right"
    if count["follows"]:
        summary += f", {count['follows']} right from your own earlier answers"
    if count["wrong"]:
        summary += f", {count['wrong']} wrong"
    lines.append(summary)
    return "\n".join(lines) + "\n"


def report_markdown(m: Marking) -> str:
    from .render.markdown import escape

    lines = ["| stage | verdict | details |", "|---|---|---|"]
    for s in m.stages:
        verdict = {"right": "✓ right", "follows": "✓ follows", "wrong": "✗ wrong"}[s.status]
        details = []
        if s.note:
            details.append(s.note)
        for w in s.wrong:
            details.append(f"[{w.row}][{w.col}]: {escape(w.given)} → {escape(w.expected)}{_approx(w)}")
        if s.diagnosis:
            details.append(f"likely cause: {s.diagnosis}")
        lines.append(f"| {s.id.replace('_', chr(92) + '_')} | {verdict} | {'<br>'.join(details)} |")
    return "\n".join(lines) + "\n"


def report_latex(m: Marking) -> str:
    from .render._grid import escape_tex

    rows = []
    for s in m.stages:
        verdict = {"right": "right", "follows": "follows", "wrong": "wrong"}[s.status]
        details = [escape_tex(s.note)] if s.note else []
        for w in s.wrong:
            details.append(f"[{w.row}][{w.col}]: {escape_tex(w.given)} $\\to$ \\texttt{{{escape_tex(w.expected)}}}")
        if s.diagnosis:
            details.append("likely cause: " + escape_tex(s.diagnosis))
        cell = " \\newline ".join(details) or "--"
        rows.append(f"{escape_tex(s.id)} & {verdict} & {cell} \\\\")
    body = "\n".join(rows)
    return (
        "\\begin{tabular}{l l p{0.6\\linewidth}}\n\\hline\nstage & verdict & details \\\\\n\\hline\n"
        + body
        + "\n\\hline\n\\end{tabular}\n"
    )
