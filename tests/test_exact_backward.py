"""The exact backward pass: every gradient of attention, checked from scratch.

Nothing here trusts symattn's numbers. Each problem is read back by the test
from its YAML *text* (``yaml.BaseLoader``: every scalar stays a string, turned
into ``fractions.Fraction`` by hand), and the test computes, in mpmath at 50
digits, the forward pass and then the backward pass by the textbook formulas

    dO                       = 1 (L = Σ O),  W (L = Σ W∘O),  O − T (L = ½‖O − T‖²),  or given
    dW_O = concatᵀ·dO,  dconcat = dO·W_Oᵀ,  head h's dO = its column block of dconcat
    dV = Aᵀ·dO,  dA = dO·Vᵀ,  dŜ_ij = A_ij (dA_ij − Σ_k dA_ik A_ik),  dS = scale·dŜ
    dQ = dS·K,  dK = dSᵀ·Q,  dW_Q = Xᵀ·dQ,  dW_K = Cᵀ·dK,  dW_V = Cᵀ·dV
    dX = Σ_h dQ·W_Qᵀ (+ dK·W_Kᵀ + dV·W_Vᵀ for self-attention),  dcontext = Σ_h dK·W_Kᵀ + dV·W_Vᵀ

The reference is itself checked against central finite differences (in
mpmath) and, when PyTorch is importable, against autograd in float64 through
``scaled_dot_product_attention``; those tests run without the backward pass of
symattn. Then symattn's gradient stages are held to the reference (1e-25),
to SymPy's own evaluation of the exact entries, and to PyTorch (1e-10).

Sections:
0. the test's own reference, checked (finite differences, PyTorch);
1. the ``backward:`` section of problem files (the loader);
2. stage ids, shapes, and the forward pass left alone;
3. values: worked examples and random problems against the reference;
4. exactness: masked positions, row sums, loss kinds, symbols;
5. PyTorch autograd and ``symattn.crosscheck``;
6. the command line: JSON, Markdown, LaTeX (compiled), the entry point;
7. ``symattn check`` with gradient answers;
8. bad ``backward:`` sections.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest
import sympy
import yaml

import symattn
from symattn import SymattnError
from symattn.problem.load import parse_problem
from symattn.problem.model import SUM_LOSS, Backward
from _child import SymattnCli
from _reference import allowed_grid, answers_text, backward_supported, fmatrix, frac, has_norm, quoted, yaml_matrix
from _reference import attention_loss_rounding, central_difference_bound
from _reference import rounded_grid as _rounded_grid

try:
    import torch as _torch
except ImportError:  # pragma: no cover - torch is optional
    _torch = None

ROOT = Path(__file__).resolve().parent.parent
# (RoPE's cosines and sines are beyond this file's fractions: the backward pass through RoPE is checked in
# tests/test_exact_rope_backward.py against mpmath, and in test_reference_numeric_backward.py; grouped-query
# attention (kv_heads) has no backward pass yet: its examples are forward-only.) Positional encodings
# (sines and cosines) are beyond this file's fractions: their gradients are checked in
# test_problem_positions.py (finite differences and PyTorch autograd). Projection biases (b_Q, ..., b_O) are
# beyond this file's reading of a problem: their forward and backward passes are checked in
# test_exact_bias.py (by hand, NumPy and PyTorch autograd). Weights from a checkpoint's layout (from:) are
# not in this file's YAML reference either: test_problem_layouts.py checks them against PyTorch. Nor is a
# norm or the residual stream: tests/test_norm_backward.py checks their gradients against mpmath, PyTorch
# and transformers' own modules.
EXAMPLES = sorted(p for p in (ROOT / "worked_examples").glob("*.yaml")
                  if not p.stem.startswith("rope") and backward_supported(p) and not has_norm(p)
                  and not any(line.startswith(("positions:", "from:")) for line in p.read_text("utf-8").splitlines())
                  and "b_Q:" not in p.read_text("utf-8"))
CAUSAL4 = ROOT / "worked_examples" / "causal_4_tokens.yaml"
TWO_HEADS = ROOT / "worked_examples" / "two_heads.yaml"

DPS = 50  # digits of the mpmath reference
EVAL_DPS = 40  # digits asked of symattn's evaluate
EXACT_TOL = mpmath.mpf("1e-25")  # symattn against the reference, relative to max(1, |value|)
TORCH_TOL = 1e-10  # PyTorch float64 against symattn, relative to max(1, |value|)
JSON_TOL = 1e-12  # the JSON decimals against the reference

NEG_INF_TEXT = {"-inf", "-.inf", "-.Inf", "-.INF", "-oo"}
FORWARD_PER_HEAD = ["W_Q", "W_K", "W_V", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]
FORWARD_GIVEN = ["Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]
FORWARD_TILED = ["m_tiled", "l_tiled", "acc_tiled", "O_tiled"]  # with a tiling: section, after each head's O
DECODE_PER_HEAD = ["K_cache", "V_cache", "q_t", "s_t", "a_t", "o_t", "o_t_diff"]
GRADIENT_PER_HEAD = ["dV", "dA", "dS_masked", "dS", "dQ", "dK"]
GRADIENT_WEIGHTS = ["dW_Q", "dW_K", "dW_V"]


# ---------------------------------------------------------------------------
# The test's own reading of a problem
# ---------------------------------------------------------------------------


KEEP = object()  # read_spec: take the loss from the file


@dataclass
class Spec:
    """A problem as the test reads it. ``leaves`` are the given matrices by forward id:
    ``Q``, ``K``, ``V``; or ``X``, ``context``, ``[headN.]W_Q``/``W_K``/``W_V`` and ``W_O``."""

    leaves: dict[str, list[list[Fraction]]]
    projected: bool
    cross: bool
    multi: bool
    n_heads: int
    scale: str | Fraction
    allowed: list[list[bool]]
    bias: list | None  # Fraction, or None for -inf
    loss: tuple[str, list | None] | None  # ("sum", None), ("weights", W), ("target", T), ("dO", G)
    tiled: bool = False  # a tiling: section: the online softmax's stages follow each head's O
    decode: int | None = None  # decode: t adds token t's row from the KV cache after each head's forward stages

    def prefix(self, h: int) -> str:
        return f"head{h + 1}." if self.multi else ""

    @property
    def n_q(self) -> int:
        return len(self.leaves["X" if self.projected else "Q"])

    @property
    def n_k(self) -> int:
        if not self.projected:
            return len(self.leaves["K"])
        return len(self.leaves["context" if self.cross else "X"])

    @property
    def d_out(self) -> int:
        if self.multi:
            return len(self.leaves["W_O"][0])
        return len(self.leaves["W_V" if self.projected else "V"][0])

    def usable(self, i: int, j: int) -> bool:
        return self.allowed[i][j] and (self.bias is None or self.bias[i][j] is not None)

    def scale_of(self, d_k: int):
        if self.scale == "auto":
            return 1 / mpmath.sqrt(d_k)
        if self.scale == "none":
            return mpmath.mpf(1)
        return mpf(self.scale)


def read_spec(text: str, loss=KEEP) -> Spec:
    raw = yaml.load(text, Loader=yaml.BaseLoader)
    values = {k: frac(v) for k, v in raw.get("values", {}).items()}
    leaves: dict[str, list] = {}
    projected = "X" in raw
    cross = "context" in raw
    multi = "heads" in raw
    if not projected:
        for name in ("Q", "K", "V"):
            leaves[name] = fmatrix(raw[name], values)
        n_heads = 1
    else:
        leaves["X"] = fmatrix(raw["X"], values)
        if cross:
            leaves["context"] = fmatrix(raw["context"], values)
        heads = raw["heads"] if multi else [raw]
        for h, head in enumerate(heads):
            pre = f"head{h + 1}." if multi else ""
            for name in ("W_Q", "W_K", "W_V"):
                leaves[pre + name] = fmatrix(head[name], values)
        if multi:
            leaves["W_O"] = fmatrix(raw["W_O"], values)
        n_heads = len(heads)
    scale_text = raw.get("scale", "auto")
    scale = scale_text if scale_text in ("auto", "none") else frac(scale_text)
    n_q = len(leaves["X" if projected else "Q"])
    n_k = len(leaves["K"]) if not projected else len(leaves["context" if cross else "X"])
    allowed = allowed_grid(raw.get("mask", "none"), n_q, n_k)
    bias = None
    if "bias" in raw:
        bias = [[None if x.strip() in NEG_INF_TEXT else frac(x, values) for x in row] for row in raw["bias"]]
    if loss is KEEP:
        loss = None
        section = raw.get("backward")
        if section is not None:
            if "dO" in section:
                loss = ("dO", fmatrix(section["dO"], values))
            elif section["loss"] == "sum":
                loss = ("sum", None)
            else:
                (kind, rows), = section["loss"].items()
                loss = (kind, fmatrix(rows, values))
    decode = int(raw["decode"]) if "decode" in raw else None
    return Spec(leaves, projected, cross, multi, n_heads, scale, allowed, bias, loss, "tiling" in raw, decode)


# ---------------------------------------------------------------------------
# The reference: forward and backward in mpmath at 50 digits
# ---------------------------------------------------------------------------


def mpf(f: Fraction) -> mpmath.mpf:
    return mpmath.mpf(f.numerator) / f.denominator


def mp_matrix(rows) -> list[list[mpmath.mpf]]:
    return [[mpf(x) if isinstance(x, Fraction) else mpmath.mpf(x) for x in row] for row in rows]


def mm(a, b):
    assert len(a[0]) == len(b), (len(a), len(a[0]), len(b), len(b[0]))
    return [[mpmath.fsum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def tr(a):
    return [list(col) for col in zip(*a)]


def madd(a, b):
    return [[x + y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def zeros(r: int, c: int):
    return [[mpmath.mpf(0)] * c for _ in range(r)]


def grad_id(forward_id: str) -> str:
    """``"head2.W_Q"`` → ``"head2.dW_Q"``, ``"context"`` → ``"dcontext"``."""
    pre, _, kind = forward_id.rpartition(".")
    return (pre + "." if pre else "") + "d" + kind


def forward_id_of(gradient_id: str) -> str:
    pre, _, kind = gradient_id.rpartition(".")
    assert kind.startswith("d"), gradient_id
    return (pre + "." if pre else "") + kind[1:]


def mp_forward(spec: Spec, leaves: dict | None = None) -> dict[str, list]:
    """Every forward matrix the backward pass needs, at the current mpmath precision."""
    L = leaves if leaves is not None else {k: mp_matrix(v) for k, v in spec.leaves.items()}
    out: dict[str, list] = {}
    if spec.projected:
        X = L["X"]
        C = L["context"] if spec.cross else X
    outputs = []
    for h in range(spec.n_heads):
        pre = spec.prefix(h)
        if spec.projected:
            Q, K, V = mm(X, L[pre + "W_Q"]), mm(C, L[pre + "W_K"]), mm(C, L[pre + "W_V"])
        else:
            Q, K, V = L["Q"], L["K"], L["V"]
        scale = spec.scale_of(len(Q[0]))
        S = mm(Q, tr(K))
        A = []
        for i in range(spec.n_q):
            z = [S[i][j] * scale + (mpf(spec.bias[i][j]) if spec.bias is not None else 0) if spec.usable(i, j) else None
                 for j in range(spec.n_k)]
            top = max(x for x in z if x is not None)
            e = [mpmath.mpf(0) if x is None else mpmath.exp(x - top) for x in z]
            total = mpmath.fsum(e)
            A.append([x / total for x in e])
        O = mm(A, V)
        out.update({pre + "Q": Q, pre + "K": K, pre + "V": V, pre + "S": S, pre + "A": A, pre + "O": O})
        out[pre + "scale"] = scale
        outputs.append(O)
    if spec.multi:
        out["concat"] = [[x for o in outputs for x in o[i]] for i in range(spec.n_q)]
        out["O"] = mm(out["concat"], L["W_O"])
    return out


def upstream(spec: Spec, O) -> list:
    kind, matrix = spec.loss
    if kind == "sum":
        return [[mpmath.mpf(1)] * len(O[0]) for _ in O]
    if kind in ("weights", "dO"):
        return mp_matrix(matrix)
    assert kind == "target", kind
    T = mp_matrix(matrix)
    return [[o - t for o, t in zip(ro, rt)] for ro, rt in zip(O, T)]


def loss_value(spec: Spec, O) -> mpmath.mpf:
    """The scalar loss whose gradient with respect to O is ``upstream`` (dO given: L = Σ dO∘O)."""
    kind, matrix = spec.loss
    if kind == "sum":
        return mpmath.fsum(x for row in O for x in row)
    if kind in ("weights", "dO"):
        W = mp_matrix(matrix)
        return mpmath.fsum(w * o for rw, ro in zip(W, O) for w, o in zip(rw, ro))
    T = mp_matrix(matrix)
    return mpmath.fsum((o - t) ** 2 for ro, rt in zip(O, T) for o, t in zip(ro, rt)) / 2


def mp_backward(spec: Spec, leaves: dict | None = None) -> dict[str, list]:
    """The forward matrices and every gradient stage, keyed by symattn's stage ids."""
    assert spec.loss is not None, "the problem has no loss"
    L = leaves if leaves is not None else {k: mp_matrix(v) for k, v in spec.leaves.items()}
    out = mp_forward(spec, L)
    dO = upstream(spec, out["O"])
    out["dO"] = dO
    if spec.multi:
        out["dW_O"] = mm(tr(out["concat"]), dO)
        dconcat = mm(dO, tr(L["W_O"]))
        out["dconcat"] = dconcat
    if spec.projected:
        X = L["X"]
        C = L["context"] if spec.cross else X
        dX = zeros(len(X), len(X[0]))
        dC = zeros(len(C), len(C[0]))
    column = 0
    for h in range(spec.n_heads):
        pre = spec.prefix(h)
        A, Q, K, V, scale = (out[pre + k] for k in ("A", "Q", "K", "V", "scale"))
        if spec.multi:
            width = len(V[0])
            dOh = [row[column:column + width] for row in dconcat]
            column += width
            out[pre + "dO"] = dOh
        else:
            dOh = dO
        dV = mm(tr(A), dOh)
        dA = mm(dOh, tr(V))
        dSm = []
        for i in range(len(A)):
            dot = mpmath.fsum(dA[i][k] * A[i][k] for k in range(len(A[i])))
            dSm.append([A[i][j] * (dA[i][j] - dot) for j in range(len(A[i]))])
        dS = [[scale * x for x in row] for row in dSm]
        dQ = mm(dS, K)
        dK = mm(tr(dS), Q)
        out.update({pre + "dV": dV, pre + "dA": dA, pre + "dS_masked": dSm, pre + "dS": dS,
                    pre + "dQ": dQ, pre + "dK": dK})
        if spec.projected:
            W_Q, W_K, W_V = L[pre + "W_Q"], L[pre + "W_K"], L[pre + "W_V"]
            out[pre + "dW_Q"] = mm(tr(X), dQ)
            out[pre + "dW_K"] = mm(tr(C), dK)
            out[pre + "dW_V"] = mm(tr(C), dV)
            dX = madd(dX, mm(dQ, tr(W_Q)))
            kv = madd(mm(dK, tr(W_K)), mm(dV, tr(W_V)))
            if spec.cross:
                dC = madd(dC, kv)
            else:
                dX = madd(dX, kv)
    if spec.projected:
        out["dX"] = dX
        if spec.cross:
            out["dcontext"] = dC
    return out


_REFERENCES: dict = {}


def reference(key, spec: Spec) -> dict[str, list]:
    """``mp_backward(spec)`` at 50 digits, computed once per ``key``."""
    if key not in _REFERENCES:
        with mpmath.workdps(DPS):
            _REFERENCES[key] = mp_backward(spec)
    return _REFERENCES[key]


def forward_ids(spec: Spec) -> list[str]:
    tiled = FORWARD_TILED if spec.tiled else []
    if not spec.projected:
        return FORWARD_GIVEN + tiled + ([*DECODE_PER_HEAD, "step_cost"] if spec.decode is not None else [])
    ids = ["X"] + (["context"] if spec.cross else [])
    for h in range(spec.n_heads):
        ids += [spec.prefix(h) + s for s in FORWARD_PER_HEAD + tiled]
        if spec.decode is not None:
            ids += [spec.prefix(h) + s for s in DECODE_PER_HEAD]
    if spec.decode is not None:
        ids.append("step_cost")
    if spec.multi:
        ids += ["concat", "W_O", "O"]
    return ids


def gradient_ids(spec: Spec) -> list[str]:
    """The gradient stage ids of the contract, in order: dO; with heads dW_O, dconcat and every
    head's dO (its block of dconcat); then head by head dV ... dK (and dW_Q, dW_K, dW_V); dX, dcontext."""
    ids = ["dO"]
    if spec.multi:
        ids += ["dW_O", "dconcat"] + [spec.prefix(h) + "dO" for h in range(spec.n_heads)]
    for h in range(spec.n_heads):
        pre = spec.prefix(h)
        ids += [pre + s for s in GRADIENT_PER_HEAD]
        if spec.projected:
            ids += [pre + s for s in GRADIENT_WEIGHTS]
    if spec.projected:
        ids.append("dX")
        if spec.cross:
            ids.append("dcontext")
    return ids


def leaf_gradient_ids(spec: Spec) -> list[str]:
    return [grad_id(k) for k in spec.leaves]


def sympy_matrix(rows) -> sympy.ImmutableMatrix:
    return sympy.ImmutableMatrix([[sympy.Rational(x.numerator, x.denominator) for x in row] for row in rows])


def backward_of(spec_loss) -> Backward:
    kind, matrix = spec_loss
    return SUM_LOSS if kind == "sum" else Backward(kind, sympy_matrix(matrix))


# ---------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------


def assert_close(got, want, tol, what: str) -> None:
    with mpmath.workdps(DPS):  # the differences are taken at 50 digits, not mpmath's default 15
        _assert_close(got, want, tol, what)


def _assert_close(got, want, tol, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} rows, expected {len(want)}"
    for i, (g_row, w_row) in enumerate(zip(got, want)):
        assert len(g_row) == len(w_row), f"{what}[{i}]: {len(g_row)} entries, expected {len(w_row)}"
        for j, (g, w) in enumerate(zip(g_row, w_row)):
            g = g if isinstance(g, mpmath.mpf) else mpmath.mpf(g)
            assert not mpmath.isnan(g) and not mpmath.isinf(g), f"{what}[{i}][{j}] = {g}"
            err = abs(g - w)
            assert err <= tol * max(1, abs(w)), (
                f"{what}[{i}][{j}]: got {mpmath.nstr(g, 30)}, expected {mpmath.nstr(w, 30)} "
                f"(|diff| = {mpmath.nstr(err, 5)})"
            )


def assert_float_close(got, want, tol, what: str) -> None:
    """``got`` (floats, a NumPy array or nested lists) against ``want`` (mpmath), relative to max(1, |want|)."""
    rows = [list(map(float, r)) for r in got]
    assert len(rows) == len(want), f"{what}: {len(rows)} rows, expected {len(want)}"
    for i, (g_row, w_row) in enumerate(zip(rows, want)):
        assert len(g_row) == len(w_row), f"{what}[{i}]"
        for j, (g, w) in enumerate(zip(g_row, w_row)):
            w = float(w)
            assert math.isfinite(g) and abs(g - w) <= tol * max(1.0, abs(w)), f"{what}[{i}][{j}]: got {g!r}, expected {w!r}"


def sympy_mpf(x: sympy.Expr, subs=None) -> mpmath.mpf:
    """An exact SymPy entry evaluated by SymPy itself (not by symattn's evaluate)."""
    if subs:
        x = x.xreplace(subs)
    v = sympy.N(x, DPS)
    assert v.is_number and v.is_real is not False, x
    with mpmath.workdps(DPS):
        return mpmath.mpf(str(v))


def exactly_zero(x: sympy.Expr) -> bool:
    """Whether an exact expression is exactly 0 (cheap forms first, then simplify)."""
    if x == 0:
        return True
    if sympy.expand(sympy.numer(sympy.together(x))) == 0:
        return True
    return sympy.simplify(x) == 0


def problem_subs(d) -> dict:
    return dict(d.problem.values)


def check_no_infinities(d, ids) -> None:
    bad = (sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)
    for sid in ids:
        m = d.step(sid).exact
        for i in range(m.rows):
            for j in range(m.cols):
                e = m[i, j]
                assert not any(e.has(b) for b in bad), (sid, i, j, e)
        assert not m.atoms(sympy.Float), f"{sid}: a float crept into the exact matrix"


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------


CLI = SymattnCli()  # for the helpers below; a test takes the symattn_cli fixture


# ---------------------------------------------------------------------------
# Problems: worked examples (with a loss set here) and random problems
# ---------------------------------------------------------------------------


def _has_backward_section(path: Path) -> bool:
    raw = yaml.load(path.read_text("utf-8"), Loader=yaml.BaseLoader)
    return isinstance(raw, dict) and "backward" in raw


def _loss_matrix(rng: random.Random, rows: int, cols: int) -> list[list[Fraction]]:
    return [[Fraction(rng.randint(-3, 3), rng.choice([1, 2, 4])) for _ in range(cols)] for _ in range(rows)]


def _example_cases():
    cases = []
    for k, path in enumerate(EXAMPLES):
        cases.append((path.name, "sum"))
        cases.append((path.name, "weights" if k % 2 == 0 else "target"))
        if _has_backward_section(path):
            cases.append((path.name, "file"))
    return cases


EXAMPLE_CASES = _example_cases()


def other_kind(name: str) -> str:
    """The loss other than ``sum`` a worked example is derived with here (weights or target)."""
    (kind,) = [k for n, k in EXAMPLE_CASES if n == name and k in ("weights", "target")]
    return kind


@functools.cache
def example_case(name: str, kind: str):
    """(spec, derivation) of a worked example with the loss ``kind`` (``file``: the file's own section)."""
    path = ROOT / "worked_examples" / name
    text = path.read_text("utf-8")
    p = symattn.load_problem(path)
    if kind == "file":
        spec = read_spec(text)
        assert p.backward is not None
        return spec, symattn.derive(p)
    base = read_spec(text, loss=None)
    if kind == "sum":
        loss = ("sum", None)
    else:
        loss = (kind, _loss_matrix(random.Random(f"{name}:{kind}"), base.n_q, base.d_out))
    spec = dataclasses.replace(base, loss=loss)
    return spec, symattn.derive(dataclasses.replace(p, backward=backward_of(loss)))


CATEGORIES = ["given", "self", "cross", "multi-self", "multi-cross"]
MASKS = ["none", "causal", "causal-bottom-right", "padding"]
LOSSES = ["dO", "sum", "weights", "target"]
N_RANDOM = 40


def _entries(rng: random.Random, r: int, c: int) -> list[list[Fraction]]:
    return [[Fraction(rng.randint(-3, 3), rng.choice([1, 1, 2, 3])) for _ in range(c)] for _ in range(r)]


def random_problem(rng: random.Random, index: int) -> str:
    """A small problem with a ``backward:`` section; structure, mask and loss cycle with ``index``."""
    category = CATEGORIES[index % len(CATEGORIES)]
    mask_kind = MASKS[(index // len(CATEGORIES)) % len(MASKS)]
    loss = LOSSES[index % len(LOSSES)]
    most = 3 if category.startswith("multi") else 4  # two heads: keep the exact expressions small
    n_q = rng.randint(1, most)
    n_k = rng.randint(1, most) if category in ("given", "cross", "multi-cross") else n_q
    if mask_kind == "causal-bottom-right" and n_q > n_k:
        n_q, n_k = n_k, n_q  # otherwise a row would see no key
    lines = [f"title: random backward problem {index}"]
    if category == "given":
        d_k, d_v = rng.randint(1, 3), rng.randint(1, 3)
        lines += [f"Q: {yaml_matrix(_entries(rng, n_q, d_k))}",
                  f"K: {yaml_matrix(_entries(rng, n_k, d_k))}",
                  f"V: {yaml_matrix(_entries(rng, n_k, d_v))}"]
        d_out = d_v
    else:
        d_model = rng.randint(1, 2 if category.startswith("multi") else 3)
        lines.append(f"X: {yaml_matrix(_entries(rng, n_q, d_model))}")
        if category.endswith("cross"):
            lines.append(f"context: {yaml_matrix(_entries(rng, n_k, d_model))}")
        if category.startswith("multi"):
            lines.append("heads:")
            width = 0
            for _ in range(2):
                d_k, d_v = rng.randint(1, 3), rng.randint(1, 2)
                width += d_v
                lines += [f"  - W_Q: {yaml_matrix(_entries(rng, d_model, d_k))}",
                          f"    W_K: {yaml_matrix(_entries(rng, d_model, d_k))}",
                          f"    W_V: {yaml_matrix(_entries(rng, d_model, d_v))}"]
            d_out = rng.randint(1, 3)
            lines.append(f"W_O: {yaml_matrix(_entries(rng, width, d_out))}")
        else:
            d_k, d_v = rng.randint(1, 3), rng.randint(1, 3)
            lines += [f"W_Q: {yaml_matrix(_entries(rng, d_model, d_k))}",
                      f"W_K: {yaml_matrix(_entries(rng, d_model, d_k))}",
                      f"W_V: {yaml_matrix(_entries(rng, d_model, d_v))}"]
            d_out = d_v
    if mask_kind == "padding":
        hidden = rng.randint(0, n_k - 1)  # the last `hidden` keys are padding
        row = ["1"] * (n_k - hidden) + ["0"] * hidden
        lines.append(f"mask: {yaml_matrix([row] * n_q)}")
        mask_value: object = [row] * n_q
    else:
        lines.append(f"mask: {mask_kind}")
        mask_value = mask_kind
    if rng.random() < 0.4:
        allowed = allowed_grid(mask_value, n_q, n_k)
        bias = []
        for i in range(n_q):
            keep = rng.choice([j for j in range(n_k) if allowed[i][j]])  # stays allowed and finite
            bias.append([Fraction(rng.randint(-4, 4), rng.choice([1, 2]))
                         if j == keep or rng.random() < 0.8 else "-inf" for j in range(n_k)])
        lines.append(f"bias: {yaml_matrix(bias)}")
    lines.append("scale: " + rng.choice(["auto", "auto", "none", quoted(Fraction(rng.randint(1, 3), rng.randint(1, 3)))]))
    lines.append("backward:")
    if loss == "dO":
        lines.append(f"  dO: {yaml_matrix(_entries(rng, n_q, d_out))}")
    elif loss == "sum":
        lines.append("  loss: sum")
    else:
        lines.append(f"  loss: {{{loss}: {yaml_matrix(_entries(rng, n_q, d_out))}}}")
    return "\n".join(lines) + "\n"


_rng = random.Random(20250701)
RANDOM_PROBLEMS = [random_problem(_rng, i) for i in range(N_RANDOM)]


@functools.cache
def random_case(index: int):
    text = RANDOM_PROBLEMS[index]
    return read_spec(text), symattn.derive(parse_problem(text, f"random_{index}.yaml"))


def random_spec(index: int) -> Spec:
    return read_spec(RANDOM_PROBLEMS[index])


# ---------------------------------------------------------------------------
# PyTorch: autograd in float64 (through scaled_dot_product_attention)
# ---------------------------------------------------------------------------


def torch_gradients(spec: Spec, sdpa: bool = True) -> dict:
    """Gradients by autograd, keyed by gradient id, from the test's own float inputs.

    ``sdpa=True`` computes each head with ``scaled_dot_product_attention`` (leaf
    gradients, dQ/dK/dV, the dO's); ``sdpa=False`` writes the head out
    (S, Ŝ = S·scale + M, softmax, A·V) so dS, dS_masked and dA can be read too.
    """
    torch = _torch
    F = torch.nn.functional

    def leaf(rows):
        return torch.tensor([[float(x) for x in row] for row in rows], dtype=torch.float64, requires_grad=True)

    leaves = {k: leaf(v) for k, v in spec.leaves.items()}
    mask = torch.tensor(
        [[0.0 if spec.allowed[i][j] else float("-inf") for j in range(spec.n_k)] for i in range(spec.n_q)],
        dtype=torch.float64,
    )
    if spec.bias is not None:
        mask = mask + torch.tensor([[float("-inf") if b is None else float(b) for b in row] for row in spec.bias],
                                   dtype=torch.float64)
    kept: dict = {}

    def keep(name, t):
        if not t.is_leaf:
            t.retain_grad()
        kept[name] = t
        return t

    if spec.projected:
        X = leaves["X"]
        C = leaves["context"] if spec.cross else X
    outputs = []
    for h in range(spec.n_heads):
        pre = spec.prefix(h)
        if spec.projected:
            Q = keep(pre + "Q", X @ leaves[pre + "W_Q"])
            K = keep(pre + "K", C @ leaves[pre + "W_K"])
            V = keep(pre + "V", C @ leaves[pre + "W_V"])
        else:
            Q, K, V = leaves["Q"], leaves["K"], leaves["V"]
        d_k = Q.shape[1]
        scale = {"auto": 1.0 / math.sqrt(d_k), "none": 1.0}[spec.scale] if isinstance(spec.scale, str) else float(spec.scale)
        if sdpa:
            O_h = F.scaled_dot_product_attention(Q[None], K[None], V[None], attn_mask=mask, scale=scale)[0]
        else:
            S = keep(pre + "S", Q @ K.T)
            Z = keep(pre + "S_masked", S * scale + mask)
            A = keep(pre + "A", torch.softmax(Z, dim=-1))
            O_h = A @ V
        if spec.multi:
            keep(pre + "O", O_h)
        outputs.append(O_h)
    if spec.multi:
        concat = keep("concat", torch.cat(outputs, dim=1))
        O = concat @ leaves["W_O"]
    else:
        O = outputs[0]
    keep("O", O)
    kind, matrix = spec.loss
    if kind == "sum":
        loss = O.sum()
    elif kind == "target":
        T = torch.tensor([[float(x) for x in row] for row in matrix], dtype=torch.float64)
        loss = ((O - T) ** 2).sum() / 2
    else:  # weights, or dO given: L = Σ G∘O has dL/dO = G
        G = torch.tensor([[float(x) for x in row] for row in matrix], dtype=torch.float64)
        loss = (G * O).sum()
    loss.backward()
    grads = {}
    for name, t in {**leaves, **kept}.items():
        assert t.grad is not None, name
        grads[grad_id(name)] = t.grad.detach().numpy()
    return grads


def compare_with_torch(spec: Spec, d, what: str) -> None:
    expected = set(gradient_ids(spec))
    via_sdpa = torch_gradients(spec, sdpa=True)
    written_out = torch_gradients(spec, sdpa=False)
    covered = set()
    for sid, grads in list(via_sdpa.items()) + [(s, g) for s, g in written_out.items()
                                                if s.rsplit(".", 1)[-1] in ("dA", "dS_masked", "dS")]:
        assert sid in expected, f"torch gives {sid}, which is not a gradient stage of the contract"
        assert_float_close(grads, d.evaluate(sid, EVAL_DPS), TORCH_TOL, f"{what}\ntorch {sid}")
        covered.add(sid)
    assert covered == expected, f"not compared with torch: {sorted(expected - covered)}"


# ===========================================================================
# 0. The reference itself (runs without symattn's backward pass)
# ===========================================================================


def test_random_problems_cover_the_family():
    specs = [random_spec(i) for i in range(N_RANDOM)]
    combos = {(CATEGORIES[i % 5], specs[i].loss[0]) for i in range(N_RANDOM)}
    assert len(combos) == len(CATEGORIES) * len(LOSSES), combos
    assert {MASKS[(i // 5) % 4] for i in range(N_RANDOM)} == set(MASKS)
    assert sum(s.bias is not None for s in specs) >= 8
    assert any(s.bias is not None and any(b is None for row in s.bias for b in row) for s in specs)
    assert sum(s.cross for s in specs) >= 8 and sum(s.multi for s in specs) >= 8
    assert sum(not s.projected for s in specs) >= 8
    assert sum(any(not a for row in s.allowed for a in row) for s in specs) >= 10  # masked positions
    assert sum(s.scale == "auto" for s in specs) >= 10 and sum(isinstance(s.scale, Fraction) for s in specs) >= 3
    for s in specs:
        assert s.n_q <= 5 and s.n_k <= 5
        assert all(any(s.usable(i, j) for j in range(s.n_k)) for i in range(s.n_q))


FD_STEP = mpmath.mpf("1e-20")  # the step of the central differences of the reference, at DPS digits


def _finite_difference(spec: Spec, leaf: str, i: int, j: int, h: mpmath.mpf) -> mpmath.mpf:
    """∂L/∂leaf[i][j] by a central difference, divided by the step taken at the working precision."""
    base = {k: mp_matrix(v) for k, v in spec.leaves.items()}
    values, points = [], []
    for sign in (1, -1):
        leaves = {k: [list(r) for r in v] for k, v in base.items()}
        leaves[leaf][i][j] += sign * h
        points.append(leaves[leaf][i][j])
        values.append(loss_value(spec, mp_forward(spec, leaves)["O"]))
    return (values[0] - values[1]) / (points[0] - points[1])


def _rounding_stages(spec: Spec, ref: dict) -> dict:
    """The forward matrices of the reference by stage id, the given ones and Ŝ = scale·S + M
    included: what attention_loss_rounding weighs the gradients with."""
    stages = dict(spec.leaves)
    stages.update({k: v for k, v in ref.items() if not k.rpartition(".")[2].startswith(("d", "scale"))})
    for h in range(spec.n_heads):
        pre = spec.prefix(h)
        S, scale = ref[pre + "S"], ref[pre + "scale"]
        stages[pre + "S_masked"] = [
            [S[i][j] * scale + (mpf(spec.bias[i][j]) if spec.bias is not None else 0) if spec.usable(i, j)
             else -mpmath.inf for j in range(spec.n_k)] for i in range(spec.n_q)]
    return stages


@pytest.mark.parametrize("index", range(10))
def test_reference_matches_finite_differences(index):
    """The test's backward formulas against central differences of its own forward pass (50 digits),
    each within the bound of a central difference: from the step, a second step h/2 and the
    rounding of the loss at the working precision (tests/_reference.py)."""
    spec = random_spec(index)
    with mpmath.workdps(DPS):
        ref = mp_backward(spec)
        unit_roundoff = mpmath.mpf(2) ** -mpmath.mp.prec
        gradients = {k: v for k, v in ref.items() if k.rpartition(".")[2].startswith("d")}
        target = spec.loss[1] if spec.loss[0] == "target" else None
        rounding = attention_loss_rounding(_rounding_stages(spec, ref), gradients, float(unit_roundoff), target)
        for leaf, matrix in spec.leaves.items():
            for i in range(len(matrix)):
                for j in range(len(matrix[0])):
                    fd = _finite_difference(spec, leaf, i, j, FD_STEP)
                    half = _finite_difference(spec, leaf, i, j, FD_STEP / 2)
                    bound = central_difference_bound(fd, half, FD_STEP, rounding, unit_roundoff)
                    want = ref[grad_id(leaf)][i][j]
                    assert abs(fd - want) <= bound, (leaf, i, j, fd, want, bound)


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_reference_matches_torch(index):
    pytest.importorskip("torch")
    spec = random_spec(index)
    ref = reference(("random", index), spec)
    for sdpa in (True, False):
        for sid, grads in torch_gradients(spec, sdpa=sdpa).items():
            assert_float_close(grads, ref[sid], TORCH_TOL, f"{RANDOM_PROBLEMS[index]}\n{sid} (sdpa={sdpa})")


def test_reference_by_hand():
    """One head worked by hand: Q = [[0]], K = [[1], [1]], V = [[1], [3]], no scale, L = Σ O."""
    spec = read_spec("Q: [[0]]\nK: [[1], [1]]\nV: [[1], [3]]\nscale: none\nbackward:\n  loss: sum\n")
    with mpmath.workdps(DPS):
        ref = mp_backward(spec)
    half = mpmath.mpf(1) / 2
    assert ref["A"] == [[half, half]]
    assert ref["dV"] == [[half], [half]]
    assert ref["dA"] == [[1, 3]]
    assert ref["dS_masked"] == [[-half, half]]  # a(dA - a·dA) = ½(1 − 2), ½(3 − 2)
    assert ref["dQ"] == [[0]]  # dS·K = −½ + ½
    assert ref["dK"] == [[0], [0]]  # dSᵀ·Q with Q = 0


# ===========================================================================
# 1. The loader
# ===========================================================================

BASE = "Q: [[1, 0], [0, 1]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\n"  # O is 2×1


def test_no_backward_section_means_forward_only():
    p = parse_problem(BASE, "p.yaml")
    assert p.backward is None
    assert SUM_LOSS == Backward("sum") and SUM_LOSS.matrix is None


@pytest.mark.parametrize(
    "section, kind, matrix",
    [
        ("backward:\n  loss: sum\n", "sum", None),
        ("backward:\n  dO: [[0.1], [\"1/3\"]]\n", "dO", [[sympy.Rational(1, 10)], [sympy.Rational(1, 3)]]),
        ("backward:\n  loss: {weights: [[2], [-1]]}\n", "weights", [[2], [-1]]),
        ("backward:\n  loss:\n    target: [[0.5], [2e-1]]\n", "target", [[sympy.Rational(1, 2)], [sympy.Rational(1, 5)]]),
    ],
    ids=["sum", "dO", "weights", "target"],
)
def test_backward_section_is_read_exactly(section, kind, matrix):
    p = parse_problem(BASE + section, "p.yaml")
    assert p.backward.kind == kind
    if matrix is None:
        assert p.backward.matrix is None and p.backward == SUM_LOSS
    else:
        assert p.backward.matrix == sympy.ImmutableMatrix(matrix)
        assert not p.backward.matrix.atoms(sympy.Float)


def test_backward_section_has_the_shape_of_the_final_output_with_heads():
    text = (
        "X: [[1, 0], [0, 1], [1, 1]]\n"
        "heads:\n"
        "  - {W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1], [0]]}\n"
        "  - {W_Q: [[1], [1]], W_K: [[0], [1]], W_V: [[1, 0], [0, 1]]}\n"
        "W_O: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]\n"   # d_out = 4
        "backward:\n"
        "  loss: {target: [[1, 2, 3, 4], [0, 0, 0, 0], [1, 1, 1, 1]]}\n"
    )
    p = parse_problem(text, "p.yaml")
    assert p.backward.kind == "target" and p.backward.matrix.shape == (3, 4)
    with pytest.raises(SymattnError) as info:
        parse_problem(text.replace("[[1, 2, 3, 4], [0, 0, 0, 0], [1, 1, 1, 1]]", "[[1, 2, 3], [0, 0, 0], [1, 1, 1]]"), "p.yaml")
    # `  loss: {target: ` is 17 characters: the matrix starts in column 18 of line 7
    assert str(info.value).startswith("p.yaml:7:18: backward.loss.target: "), str(info.value)
    assert "3×3" in str(info.value) and "3×4" in str(info.value)


def test_random_problems_load_their_backward_section():
    for index in range(N_RANDOM):
        spec = random_spec(index)
        p = parse_problem(RANDOM_PROBLEMS[index], "p.yaml")
        assert p.backward.kind == spec.loss[0]
        assert p.backward == backward_of(spec.loss), index


# ===========================================================================
# 2. Stage ids, shapes, steps, and the forward pass left alone
# ===========================================================================


def test_gradient_ids_of_the_contract_written_out():
    """The expected id lists, spelled out for each problem kind (the test's helper must agree)."""
    given = read_spec(BASE + "backward:\n  loss: sum\n")
    assert gradient_ids(given) == ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK"]
    single = read_spec("X: [[1, 0]]\nW_Q: [[1], [0]]\nW_K: [[1], [1]]\nW_V: [[1], [0]]\n", loss=("sum", None))
    assert gradient_ids(single) == ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V", "dX"]
    cross = read_spec("X: [[1, 0]]\ncontext: [[1, 0], [0, 1]]\nW_Q: [[1], [0]]\nW_K: [[1], [1]]\nW_V: [[1], [0]]\n",
                      loss=("sum", None))
    assert gradient_ids(cross) == ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V",
                                   "dX", "dcontext"]
    two = read_spec(TWO_HEADS.read_text("utf-8"), loss=("sum", None))
    per_head = ["dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V"]
    want = (["dO", "dW_O", "dconcat", "head1.dO", "head2.dO"]
            + [f"head1.{s}" for s in per_head] + [f"head2.{s}" for s in per_head] + ["dX"])
    assert gradient_ids(two) == want
    multi_cross = read_spec(
        "X: [[1, 0]]\ncontext: [[1, 0], [0, 1]]\n"
        "heads:\n  - {W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1], [0]]}\n"
        "  - {W_Q: [[1], [1]], W_K: [[0], [1]], W_V: [[0], [1]]}\nW_O: [[1], [1]]\n",
        loss=("sum", None),
    )
    assert gradient_ids(multi_cross) == (
        ["dO", "dW_O", "dconcat", "head1.dO", "head2.dO"]
        + [f"head1.{s}" for s in per_head] + [f"head2.{s}" for s in per_head] + ["dX", "dcontext"]
    )
    # every gradient id names the forward matrix whose shape it has
    assert [forward_id_of(i) for i in want[:4]] == ["O", "W_O", "concat", "head1.O"]
    assert forward_id_of("dcontext") == "context" and forward_id_of("head2.dW_V") == "head2.W_V"


def _check_ids_and_shapes(spec: Spec, d, what: str) -> None:
    fwd, grads = forward_ids(spec), gradient_ids(spec)
    assert list(d.ids) == fwd + grads, what
    for sid in grads:
        step = d.step(sid)
        m = step.exact
        like = d.step(forward_id_of(sid)).exact
        assert m.shape == like.shape == step.shape == (m.rows, m.cols), (what, sid, m.shape, like.shape)
        assert isinstance(step.title, str) and step.title.strip(), (what, sid)
        assert isinstance(step.why, str) and step.why.strip(), (what, sid)
        assert isinstance(step.formula, str) and step.formula.strip(), (what, sid)
        assert step.id == sid


@pytest.mark.parametrize("name, kind", EXAMPLE_CASES)
def test_worked_example_ids_and_shapes(name, kind):
    spec, d = example_case(name, kind)
    _check_ids_and_shapes(spec, d, name)


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_random_problem_ids_and_shapes(index):
    spec, d = random_case(index)
    _check_ids_and_shapes(spec, d, RANDOM_PROBLEMS[index])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_forward_only_derivation_is_unchanged(path):
    """Without a backward section only the forward stages are derived, as before."""
    p = dataclasses.replace(symattn.load_problem(path), backward=None)
    spec = read_spec(path.read_text("utf-8"), loss=None)
    d = symattn.derive(p)
    assert list(d.ids) == forward_ids(spec)
    assert not any(i == "dO" or i.rsplit(".", 1)[-1].startswith("d") for i in d.ids)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_backward_stages_follow_the_forward_stages_unchanged(path):
    forward = symattn.derive(dataclasses.replace(symattn.load_problem(path), backward=None))
    _, both = example_case(path.name, "sum")
    n = len(forward.steps)
    assert len(both.ids) > n, "no backward stage was derived"
    assert both.ids[:n] == forward.ids
    for a, b in zip(forward.steps, both.steps[:n]):
        assert a.exact == b.exact, a.id


def test_problem_text_without_section_has_no_gradients():
    d = symattn.derive(parse_problem(BASE, "p.yaml"))
    assert list(d.ids) == FORWARD_GIVEN


# ===========================================================================
# 3. Values against the reference
# ===========================================================================


def _check_values(key, spec: Spec, d, what: str) -> None:
    ref = reference(key, spec)
    for sid in gradient_ids(spec):
        assert_close(d.evaluate(sid, EVAL_DPS), ref[sid], EXACT_TOL, f"{what}\nevaluate({sid!r}, {EVAL_DPS})")
    # the forward output the gradients rest on
    assert_close(d.evaluate("O", EVAL_DPS), ref["O"], EXACT_TOL, f"{what}\nO")


def _check_exact_entries(key, spec: Spec, d, what: str) -> None:
    """SymPy's own evaluation of every exact gradient entry, not symattn's evaluate."""
    ref = reference(key, spec)
    subs = problem_subs(d)
    for sid in gradient_ids(spec):
        m = d.step(sid).exact
        got = [[sympy_mpf(m[i, j], subs) for j in range(m.cols)] for i in range(m.rows)]
        assert_close(got, ref[sid], EXACT_TOL, f"{what}\nN({sid}.exact)")


@pytest.mark.parametrize("name, kind", EXAMPLE_CASES)
def test_worked_example_gradients_match_the_reference(name, kind):
    spec, d = example_case(name, kind)
    _check_values(("example", name, kind), spec, d, f"{name} ({kind})")


@pytest.mark.parametrize("name", ["qkv_given.yaml", "alibi_bias.yaml", "cross_attention_top_left.yaml",
                                  "padding_mask.yaml", "symbolic_two_tokens.yaml"])
def test_worked_example_exact_entries_match_the_reference(name):
    for kind in ("sum", other_kind(name)):
        spec, d = example_case(name, kind)
        _check_exact_entries(("example", name, kind), spec, d, f"{name} ({kind})")


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_random_problem_gradients_match_the_reference(index):
    spec, d = random_case(index)
    _check_values(("random", index), spec, d, RANDOM_PROBLEMS[index])
    check_no_infinities(d, gradient_ids(spec))
    if index % 4 == 0:
        _check_exact_entries(("random", index), spec, d, RANDOM_PROBLEMS[index])


# ===========================================================================
# 4. Exactness: masked positions, row sums, loss kinds, symbols
# ===========================================================================


def _check_masked_and_row_sums(spec: Spec, d, what: str, row_sums: bool = True) -> None:
    for h in range(spec.n_heads):
        pre = spec.prefix(h)
        dSm, dS = d.step(pre + "dS_masked").exact, d.step(pre + "dS").exact
        for i in range(spec.n_q):
            for j in range(spec.n_k):
                if not spec.usable(i, j):
                    for name, m in (("dS_masked", dSm), ("dS", dS)):
                        assert m[i, j] == 0 and m[i, j].is_zero, (what, pre + name, i, j, m[i, j])
            if row_sums:
                total = sympy.Add(*[dSm[i, j] for j in range(spec.n_k)])
                assert exactly_zero(total), (what, pre + "dS_masked", i, total)
        if d.can_evaluate:
            with mpmath.workdps(DPS):
                for i, row in enumerate(d.evaluate(pre + "dS_masked", EVAL_DPS)):
                    assert abs(mpmath.fsum(row)) < mpmath.mpf("1e-30"), (what, i)


@pytest.mark.parametrize("name, kind", [c for c in EXAMPLE_CASES if c[1] == "sum"])
def test_worked_example_masked_gradients_are_zero_and_rows_sum_to_zero(name, kind):
    spec, d = example_case(name, kind)
    _check_masked_and_row_sums(spec, d, name)
    check_no_infinities(d, gradient_ids(spec))


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_random_problem_masked_gradients_are_zero(index):
    spec, d = random_case(index)
    _check_masked_and_row_sums(spec, d, RANDOM_PROBLEMS[index], row_sums=index % 2 == 0)


def test_padding_example_masked_columns_are_exactly_zero():
    spec, d = example_case("padding_mask.yaml", "sum")
    dSm = d.step("dS_masked").exact
    assert [dSm[i, j] for i in range(4) for j in (2, 3)] == [0] * 8
    assert not any(spec.usable(i, j) for i in range(4) for j in (2, 3))
    # the padding keys receive no gradient through the scores: their rows of dK are 0
    dK = d.step("dK").exact
    assert all(dK[j, c] == 0 for j in (2, 3) for c in range(dK.cols))


@pytest.mark.parametrize("name, kind", [c for c in EXAMPLE_CASES if c[1] == "sum"])
def test_exact_zero_gradients_have_zero_decimals(name, kind):
    """Where a gradient's exact entry is 0 (masked, or a sum that cancels), its 30-digit value is
    exactly 0 too, not the rounding noise of the terms; elsewhere it is the exact value's."""
    spec, d = example_case(name, kind)
    if not d.can_evaluate:
        pytest.skip("symbols without values")
    zeros = 0
    for step_id in gradient_ids(spec):
        exact = d.step(step_id).exact
        values = d.evaluate(step_id, 30)
        for i in range(exact.rows):
            for j in range(exact.cols):
                if exact[i, j] == 0:
                    zeros += 1
                    assert values[i][j] == 0, (name, step_id, i, j, values[i][j])
                else:
                    with mpmath.workdps(40):
                        reference = mpmath.mpf(sympy.N(exact[i, j].xreplace(d.problem.substitutions or {}), 40))
                        assert abs(values[i][j] - reference) <= mpmath.mpf("1e-28") * max(1, abs(reference)), (
                            name, step_id, i, j)
    assert zeros, f"{name}: no exact zero to check"


@pytest.mark.parametrize("dps", [15, 30, 45])
def test_single_key_row_has_exactly_zero_gradient_decimals(dps):
    """A query that may attend to one key only has weights (1, 0, …): its softmax Jacobian is 0,
    so its rows of dŜ, dS and dQ are exactly 0, in decimals too (no rounding noise such as 1e-41)."""
    rng = random.Random(dps)
    rows = lambda r, c: [[f"{rng.uniform(-2, 2):.6f}" for _ in range(c)] for _ in range(r)]  # noqa: E731
    text = (f"mask: causal\nX: {rows(5, 6)}\nW_Q: {rows(6, 3)}\nW_K: {rows(6, 3)}\nW_V: {rows(6, 2)}\n"
            "backward:\n  loss: sum\n").replace("'", "")
    d = symattn.derive(symattn.load_problem(text))
    for name in ("dS_masked", "dS", "dQ"):
        exact_row = d.step(name).exact.row(0)
        assert all(x == 0 for x in exact_row), (name, exact_row)
        values = d.evaluate(name, dps)[0]
        assert all(v == 0 for v in values), (name, dps, values)
    assert d.evaluate("dA", dps)[0][0] != 0  # the gradient reaching the weights is not 0 itself


@pytest.mark.parametrize("name", ["causal_4_tokens.yaml", "two_heads.yaml", "qkv_given.yaml"])
def test_sum_loss_gives_dO_all_ones(name):
    _, d = example_case(name, "sum")
    dO = d.step("dO").exact
    assert dO == sympy.ones(*dO.shape)


@pytest.mark.parametrize("name", ["causal_4_tokens.yaml", "two_heads.yaml", "qkv_given.yaml", "cross_attention_top_left.yaml"])
def test_weights_and_target_losses_give_dO_exactly(name):
    path = ROOT / "worked_examples" / name
    p = symattn.load_problem(path)
    base = read_spec(path.read_text("utf-8"), loss=None)
    rng = random.Random(name)
    W = _loss_matrix(rng, base.n_q, base.d_out)
    T = _loss_matrix(rng, base.n_q, base.d_out)
    d = symattn.derive(dataclasses.replace(p, backward=Backward("weights", sympy_matrix(W))))
    assert d.step("dO").exact == sympy_matrix(W)
    d = symattn.derive(dataclasses.replace(p, backward=Backward("target", sympy_matrix(T))))
    dO, O = d.step("dO").exact, d.step("O").exact
    for i in range(dO.rows):
        for j in range(dO.cols):
            t = sympy.Rational(T[i][j].numerator, T[i][j].denominator)
            assert exactly_zero(dO[i, j] - (O[i, j] - t)), (i, j, dO[i, j])


def test_given_dO_is_taken_as_it_is():
    text = BASE + 'backward:\n  dO: [["1/3"], [-2]]\n'
    d = symattn.derive(parse_problem(text, "p.yaml"))
    assert d.step("dO").exact == sympy.ImmutableMatrix([[sympy.Rational(1, 3)], [-2]])


def test_dV_and_dA_are_the_two_products_exactly():
    """dV = Aᵀ·dO and dA = dO·Vᵀ, checked on the exact matrices (qkv_given, a weights loss)."""
    assert other_kind("qkv_given.yaml") in ("weights", "target")
    _, d = example_case("qkv_given.yaml", other_kind("qkv_given.yaml"))
    A, V, dO = d.step("A").exact, d.step("V").exact, d.step("dO").exact
    dV, dA = d.step("dV").exact, d.step("dA").exact
    want_dV, want_dA = A.T * dO, dO * V.T
    for i in range(dV.rows):
        for j in range(dV.cols):
            assert exactly_zero(dV[i, j] - want_dV[i, j]), ("dV", i, j)
    assert dA == want_dA  # dO and V are rational here: the product is a rational matrix


SYM_Q = sympy.Symbol("q")
SYMBOLIC = "symbols: [q]\nQ: [[q]]\nK: [[1], [0]]\nV: [[1], [0]]\nscale: none\nbackward:\n  loss: sum\n"


def symbolic_at(value: Fraction) -> str:
    """The symbolic problem with the number ``value`` written in place of q."""
    text = SYMBOLIC.replace("symbols: [q]\n", "").replace("[[q]]", f'[["{value}"]]')
    assert "q" not in text.replace("title", "")
    return text


def test_symbolic_two_tokens_give_the_general_gradient():
    """L = O = e^q/(e^q + 1), so ∂L/∂q = e^q/(e^q + 1)²."""
    d = symattn.derive(parse_problem(SYMBOLIC, "p.yaml"))
    q = SYM_Q
    dQ = d.step("dQ").exact
    assert dQ.shape == (1, 1)
    assert dQ.free_symbols == {q}
    assert sympy.simplify(dQ[0, 0] - sympy.exp(q) / (sympy.exp(q) + 1) ** 2) == 0, dQ[0, 0]
    a0, a1 = sympy.exp(q) / (sympy.exp(q) + 1), 1 / (sympy.exp(q) + 1)
    dSm = d.step("dS_masked").exact
    assert sympy.simplify(dSm[0, 0] - a0 * a1) == 0 and sympy.simplify(dSm[0, 1] + a0 * a1) == 0
    assert exactly_zero(dSm[0, 0] + dSm[0, 1])
    dV, dK = d.step("dV").exact, d.step("dK").exact
    assert sympy.simplify(dV[0, 0] - a0) == 0 and sympy.simplify(dV[1, 0] - a1) == 0
    assert sympy.simplify(dK[0, 0] - q * a0 * a1) == 0 and sympy.simplify(dK[1, 0] + q * a0 * a1) == 0
    assert d.step("dA").exact == sympy.ImmutableMatrix([[1, 0]])
    assert list(d.ids) == FORWARD_GIVEN + gradient_ids(read_spec(symbolic_at(Fraction(0))))
    check_no_infinities(d, gradient_ids(read_spec(symbolic_at(Fraction(0)))))
    # substituting numbers agrees with the reference computed at those numbers
    for value in (Fraction(0), Fraction(1, 2), Fraction(-3), Fraction(7, 3)):
        spec = read_spec(symbolic_at(value))
        with mpmath.workdps(DPS):
            ref = mp_backward(spec)
        subs = {q: sympy.Rational(value.numerator, value.denominator)}
        for sid in ("dQ", "dK", "dV", "dS_masked", "dS"):
            m = d.step(sid).exact
            got = [[sympy_mpf(m[i, j], subs) for j in range(m.cols)] for i in range(m.rows)]
            assert_close(got, ref[sid], EXACT_TOL, f"{sid} at q = {value}")


def test_symbolic_gradients_evaluate_and_check_at_their_values():
    d = symattn.derive(parse_problem(SYMBOLIC + "values: {q: 1/2}\n", "p.yaml"))
    assert d.step("dQ").exact.free_symbols == {SYM_Q}, "values must not enter the derivation"
    spec = read_spec(symbolic_at(Fraction(1, 2)))
    _check_values(("symbolic", "1/2"), spec, d, "q = 1/2")
    check = symattn.crosscheck(d)
    assert check.passed is True and {"dQ", "dK", "dV"} <= set(check.per_stage)


def test_symbolic_gradients_without_values_cannot_be_evaluated_but_derive():
    d = symattn.derive(parse_problem(SYMBOLIC, "p.yaml"))
    assert "dQ" in d.ids
    check = symattn.crosscheck(d)
    assert check.passed is None and check.skipped
    with pytest.raises(SymattnError, match="values"):
        d.evaluate("dQ", 30)


# ===========================================================================
# 5. PyTorch autograd and symattn.crosscheck
# ===========================================================================


@pytest.mark.parametrize("name, kind", EXAMPLE_CASES)
def test_worked_example_gradients_match_torch(name, kind):
    pytest.importorskip("torch")
    spec, d = example_case(name, kind)
    compare_with_torch(spec, d, f"{name} ({kind})")


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_random_problem_gradients_match_torch(index):
    pytest.importorskip("torch")
    spec, d = random_case(index)
    compare_with_torch(spec, d, RANDOM_PROBLEMS[index])


def _check_crosscheck(spec: Spec, d, what: str, torch: bool) -> None:
    check = symattn.crosscheck(d, torch=torch)
    assert check.passed is True, f"{what}\n{[str(m) for m in check.all_mismatches]}"
    assert check.skipped is None
    assert set(gradient_ids(spec)) <= set(check.per_stage), sorted(set(gradient_ids(spec)) - set(check.per_stage))
    assert set(check.per_stage) == set(d.ids)
    for sid in gradient_ids(spec):
        assert math.isfinite(check.per_stage[sid]) and check.per_stage[sid] >= 0, (sid, check.per_stage[sid])
    if torch:
        assert check.torch is not None and check.torch.passed is True
        # autograd through scaled_dot_product_attention: at least the leaf gradients are compared
        assert set(leaf_gradient_ids(spec)) <= set(check.torch.per_stage), check.torch.per_stage


@pytest.mark.parametrize("name, kind", EXAMPLE_CASES)
def test_worked_example_crosscheck_covers_the_gradients(name, kind):
    spec, d = example_case(name, kind)
    _check_crosscheck(spec, d, name, torch=False)


@pytest.mark.parametrize("index", range(0, N_RANDOM, 2))  # every structure, mask and loss kind still comes up
def test_random_problem_crosscheck_covers_the_gradients(index):
    spec, d = random_case(index)
    use_torch = _torch is not None and index % 4 == 0
    _check_crosscheck(spec, d, RANDOM_PROBLEMS[index], torch=use_torch)


def test_crosscheck_with_torch_on_two_heads():
    pytest.importorskip("torch")
    spec, d = example_case("two_heads.yaml", "sum")
    _check_crosscheck(spec, d, "two_heads", torch=True)


# ===========================================================================
# 6. The command line
# ===========================================================================


def _json_stages(r) -> dict:
    assert r.exit_code == 0, (r.exit_code, r.stderr, r.exc_info)
    data = json.loads(r.stdout)
    return data


@pytest.mark.parametrize("name", ["causal_4_tokens.yaml", "two_heads.yaml", "cross_attention_bottom_right.yaml",
                                  "qkv_given.yaml"])
def test_cli_backward_json_has_every_gradient_stage(symattn_cli, tmp_path, name):
    path = ROOT / "worked_examples" / name
    spec = read_spec(path.read_text("utf-8"), loss=("sum", None))
    r = symattn_cli("derive", path, "--backward", "-f", "json", cwd=tmp_path)
    data = _json_stages(r)
    ids = [s["id"] for s in data["stages"]]
    assert ids == forward_ids(spec) + gradient_ids(spec)
    assert data["crosscheck"]["passed"] is True
    assert set(gradient_ids(spec)) <= set(data["crosscheck"]["per_stage"])
    ref = reference(("cli", name), spec)
    by_id = {s["id"]: s for s in data["stages"]}
    for sid in gradient_ids(spec):
        stage = by_id[sid]
        assert set(stage) == {"id", "title", "shape", "exact", "approx"}, sorted(stage)
        assert stage["shape"] == [len(ref[sid]), len(ref[sid][0])]
        assert stage["title"].strip()
        assert_float_close(stage["approx"], ref[sid], JSON_TOL, f"{name} JSON approx {sid}")
        assert all(isinstance(x, str) for row in stage["exact"] for x in row)
    # the exact strings of the smaller stages read back to the reference values
    for sid in ("dO", "dS_masked" if not spec.multi else "head1.dS_masked", "dX" if spec.projected else "dQ"):
        back = [[float(sympy.N(sympy.sympify(x), 30)) for x in row] for row in by_id[sid]["exact"]]
        assert_float_close(back, ref[sid], JSON_TOL, f"{name} JSON exact {sid}")


def test_cli_without_backward_has_no_gradient_stage(symattn_cli, tmp_path):
    r = symattn_cli("derive", CAUSAL4, "-f", "json", cwd=tmp_path)
    data = _json_stages(r)
    assert [s["id"] for s in data["stages"]] == forward_ids(read_spec(CAUSAL4.read_text("utf-8"), loss=None))


def test_cli_backward_flag_means_sum_loss(symattn_cli, tmp_path):
    data = _json_stages(symattn_cli("derive", CAUSAL4, "--backward", "-f", "json", cwd=tmp_path))
    dO = next(s for s in data["stages"] if s["id"] == "dO")
    assert dO["exact"] == [["1"] * 2] * 4 and dO["approx"] == [[1.0] * 2] * 4


@pytest.mark.parametrize("flag", [[], ["--backward"]], ids=["section", "section-and-flag"])
def test_cli_backward_section_is_derived_with_or_without_the_flag(symattn_cli, tmp_path, flag):
    text = BASE + "backward:\n  loss: {weights: [[3], [-1]]}\n"
    (tmp_path / "p.yaml").write_text(text, "utf-8")
    data = _json_stages(symattn_cli("derive", "p.yaml", *flag, "-f", "json", cwd=tmp_path))
    by_id = {s["id"]: s for s in data["stages"]}
    assert [s["id"] for s in data["stages"]] == FORWARD_GIVEN + gradient_ids(read_spec(text))
    assert by_id["dO"]["exact"] == [["3"], ["-1"]]  # the section's loss, not the flag's sum


def test_cli_backward_markdown_and_latex_explain_the_jacobian(symattn_cli, tmp_path):
    r = symattn_cli("derive", CAUSAL4, "--backward", "-f", "markdown", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    md = r.stdout
    assert "Jacobian" in md
    assert md.count("$$") % 2 == 0
    r = symattn_cli("derive", CAUSAL4, "--backward", "-o", "x.tex", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    tex = (tmp_path / "x.tex").read_text("utf-8")
    assert tex.startswith("\\documentclass")
    assert "Jacobian" in tex and "diag" in tex
    assert "[U+" not in tex, "prose with a character the LaTeX renderer does not map"
    # the Jacobian belongs to the backward part: the forward-only solution has none, and is shorter
    forward = symattn_cli("derive", CAUSAL4, "-o", "f.tex", cwd=tmp_path)
    assert forward.exit_code == 0
    assert "Jacobian" not in (tmp_path / "f.tex").read_text("utf-8")
    assert len(tex) > len((tmp_path / "f.tex").read_text("utf-8"))


def test_cli_backward_through_the_entry_point(symattn_cli, tmp_path):
    spec = read_spec(TWO_HEADS.read_text("utf-8"), loss=("sum", None))
    p = symattn_cli.entry("derive", TWO_HEADS, "--backward", "-f", "json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert [s["id"] for s in data["stages"]] == forward_ids(spec) + gradient_ids(spec)
    p = symattn_cli.entry("derive", CAUSAL4, "--backward", "-f", "markdown", cwd=tmp_path, how="python-m")
    assert p.returncode == 0, p.stderr
    assert "Jacobian" in p.stdout and "Traceback" not in p.stderr


def test_cli_backward_latex_compiles(symattn_cli, tmp_path):
    if shutil.which("pdflatex") is None:
        if os.environ.get("CI"):
            pytest.fail("pdflatex is required on CI")
        pytest.skip("pdflatex not installed")
    r = symattn_cli("derive", TWO_HEADS, "--backward", "--standalone", "-o", "solution.tex", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    done = subprocess.run(
        ["pdflatex", "-no-shell-escape", "-halt-on-error", "-interaction=nonstopmode", "solution.tex"],
        cwd=tmp_path, capture_output=True, stdin=subprocess.DEVNULL, timeout=300, check=False,
    )
    log = done.stdout.decode("utf-8", "replace")
    assert done.returncode == 0, [line for line in log.splitlines() if line.startswith("!")] or log[-2000:]
    assert (tmp_path / "solution.pdf").read_bytes().startswith(b"%PDF")


def test_a_worked_example_shows_the_backward_pass_with_golden_files():
    with_section = [p for p in EXAMPLES if _has_backward_section(p)]
    assert with_section, "no worked example in worked_examples/ has a backward: section"
    for path in with_section:
        d = symattn.derive(symattn.load_problem(path))
        assert any(i.rsplit(".", 1)[-1] == "dS_masked" for i in d.ids), path.name
        for suffix in (".tex", ".md"):
            golden = path.with_suffix(suffix)
            assert golden.is_file(), f"{golden.name} is missing: run python tests/update_golden.py"
            assert "Jacobian" in golden.read_text("utf-8"), golden.name


# ===========================================================================
# 7. symattn check with gradient answers
# ===========================================================================

SQUARE_BACKWARD = """\
title: Three tokens, Q K V given, with an upstream gradient
Q: [[1, 2, 0], [0, 1, 3], [2, 0, 1]]
K: [[1, 0, 2], [3, 1, 0], [0, 2, 1]]
V: [[1, 0, 2], [0, 1, 1], [2, 1, 0]]
backward:
  dO: [[1, -1, 2], [0, 2, -1], ["1/2", 1, 0]]
"""
PLACES = 6
rounded_grid = functools.partial(_rounded_grid, places=PLACES)


def run_check(tmp_path: Path, problem: Path, stages: dict, *extra):
    answers = tmp_path / "answers.yaml"
    answers.write_text(answers_text(stages), "utf-8")
    r = CLI("check", problem, answers, "--format", "json", *extra, cwd=tmp_path)
    return r


def check_report(tmp_path, problem, stages, *extra) -> tuple[int, dict]:
    r = run_check(tmp_path, problem, stages, *extra)
    assert r.stderr == "", r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exc_info
    return r.exit_code, json.loads(r.stdout)


def statuses(report: dict) -> dict[str, str]:
    return {s["id"]: s["status"] for s in report["stages"]}


def stage_of(report: dict, sid: str) -> dict:
    (s,) = [s for s in report["stages"] if s["id"] == sid]
    return s


@pytest.fixture
def square(tmp_path):
    path = tmp_path / "square.yaml"
    path.write_text(SQUARE_BACKWARD, "utf-8")
    with mpmath.workdps(DPS):
        ref = mp_backward(read_spec(SQUARE_BACKWARD))
    return path, ref


def _differs(a, b) -> bool:
    """Whether two grids differ by far more than the rounding of the answers."""
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) > mpmath.mpf("0.001")


def test_correct_gradient_answers_pass(tmp_path, square):
    path, ref = square
    ids = gradient_ids(read_spec(SQUARE_BACKWARD))
    stages = {"A": rounded_grid(ref["A"]), **{sid: rounded_grid(ref[sid]) for sid in ids if sid != "dO"}}
    stages["dO"] = [["1", "-1", "2"], ["0", "2", "-1"], ["1/2", "1", "0"]]  # exact
    code, report = check_report(tmp_path, path, stages)
    assert statuses(report) == {sid: "right" for sid in ["A"] + ids}, report
    assert report["passed"] is True and code == 0


def test_correct_gradient_answers_with_heads_and_the_flag(tmp_path):
    spec = read_spec(TWO_HEADS.read_text("utf-8"), loss=("sum", None))
    ref = reference(("cli", "two_heads.yaml"), spec)
    ids = ["dW_O", "dconcat", "head1.dO", "head1.dQ", "head2.dS_masked", "head2.dW_V", "dX"]
    code, report = check_report(tmp_path, TWO_HEADS, {sid: rounded_grid(ref[sid]) for sid in ids}, "--backward")
    assert statuses(report) == dict.fromkeys(ids, "right"), report
    assert code == 0


def test_gradient_answers_without_backward_are_an_error_naming_backward(tmp_path):
    spec = read_spec(CAUSAL4.read_text("utf-8"), loss=("sum", None))
    ref = reference(("cli", "causal_4_tokens.yaml"), spec)
    r = run_check(tmp_path, CAUSAL4, {"dV": rounded_grid(ref["dV"])})
    assert r.exit_code == 1, (r.exit_code, r.stdout)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert "dV" in lines[0] and "backward" in lines[0], lines[0]
    # with --backward the same answers are marked (L = Σ O), and right
    code, report = check_report(tmp_path, CAUSAL4, {"dV": rounded_grid(ref["dV"])}, "--backward")
    assert statuses(report) == {"dV": "right"} and code == 0


def _diagnosis(tmp_path, problem, stages, sid) -> str:
    code, report = check_report(tmp_path, problem, stages)
    s = stage_of(report, sid)
    assert s["status"] == "wrong", report
    assert code == 1
    assert isinstance(s.get("diagnosis"), str), report
    return s["diagnosis"]


def test_jacobian_diagonal_only(tmp_path, square):
    path, ref = square
    A, dA = ref["A"], ref["dA"]
    wrong = [[a * (1 - a) * g for a, g in zip(ra, rg)] for ra, rg in zip(A, dA)]
    assert _differs(wrong, ref["dS_masked"])
    d = _diagnosis(tmp_path, path, {"dS_masked": rounded_grid(wrong)}, "dS_masked")
    assert "diagonal" in d.lower(), d


def test_scale_factor_missing_in_dS(tmp_path, square):
    path, ref = square
    assert _differs(ref["dS_masked"], ref["dS"])  # the scale is 1/√3 here
    d = _diagnosis(tmp_path, path, {"dS": rounded_grid(ref["dS_masked"])}, "dS")
    assert "scale" in d.lower(), d


def test_dV_as_A_times_dO(tmp_path, square):
    path, ref = square
    wrong = mm(ref["A"], ref["dO"])
    assert _differs(wrong, ref["dV"])
    d = _diagnosis(tmp_path, path, {"dV": rounded_grid(wrong)}, "dV")
    assert "transpose" in d.lower(), d


def test_dK_as_dS_times_Q(tmp_path, square):
    path, ref = square
    wrong = mm(ref["dS"], ref["Q"])
    assert _differs(wrong, ref["dK"])
    d = _diagnosis(tmp_path, path, {"dK": rounded_grid(wrong)}, "dK")
    assert "transpose" in d.lower(), d


GRADIENT_FOLLOWS_FROM = {"dS_masked": "dA", "dS": "dS_masked", "dQ": "dS", "dK": "dS"}


def test_gradient_follow_through(tmp_path, square):
    """A slip in dA, and every later gradient computed correctly from it, is marked once."""
    path, ref = square
    with mpmath.workdps(DPS):
        A, K, Q = ref["A"], ref["K"], ref["Q"]
        dA = [list(r) for r in ref["dA"]]
        dA[1][2] += 1
        dSm = []
        for i in range(len(A)):
            dot = mpmath.fsum(x * a for x, a in zip(dA[i], A[i]))
            dSm.append([A[i][j] * (dA[i][j] - dot) for j in range(len(A[i]))])
        dS = [[ref["scale"] * x for x in row] for row in dSm]
        later = {"dS_masked": dSm, "dS": dS, "dQ": mm(dS, K), "dK": mm(tr(dS), Q)}
    for sid, grid in later.items():
        assert _differs(grid, ref[sid]), sid
    stages = {"dA": rounded_grid(dA), **{k: rounded_grid(v) for k, v in later.items()}}
    code, report = check_report(tmp_path, path, stages)
    assert statuses(report) == {"dA": "wrong", **dict.fromkeys(GRADIENT_FOLLOWS_FROM, "follows")}, report
    for sid, source in GRADIENT_FOLLOWS_FROM.items():
        note = stage_of(report, sid)["note"]
        assert re.search(rf"\byour {source}\b", note), (sid, note)
    assert [(w["row"], w["col"]) for w in stage_of(report, "dA")["wrong"]] == [(1, 2)]
    assert report["passed"] is False and code == 1


def test_gradient_right_from_the_correct_values_after_a_slip(tmp_path, square):
    path, ref = square
    dA = [list(r) for r in ref["dA"]]
    dA[1][2] += 1
    stages = {"dA": rounded_grid(dA), "dS_masked": rounded_grid(ref["dS_masked"])}
    code, report = check_report(tmp_path, path, stages)
    assert statuses(report) == {"dA": "wrong", "dS_masked": "right"}
    assert code == 1


# ===========================================================================
# 8. Bad backward sections: one Error line with file:line:col
# ===========================================================================

BAD_BACKWARD = {
    # `  dO: ` is 6 characters: the matrix starts in column 7 of line 5
    "dO-shape": (BASE + "backward:\n  dO: [[1, 2]]\n", "bad.yaml:5:7: backward.dO: ", ["1×2", "2×1"]),
    # `  loss: ` is 8 characters: the value starts in column 9
    "loss-mean": (BASE + "backward:\n  loss: mean\n", "bad.yaml:5:9: backward.loss: ", ["mean"]),
    # `backward: {` is 11 characters: the key starts in column 12 of line 4
    "unknown-key": (BASE + "backward: {los: sum}\n", "bad.yaml:4:12: backward: ", ["los", "did you mean 'loss'"]),
    # `  loss: {weights: ` is 18 characters: the matrix starts in column 19
    "weights-shape": (BASE + "backward:\n  loss: {weights: [[1, 2]]}\n", "bad.yaml:5:19: backward.loss.weights: ",
                      ["1×2", "2×1"]),
    # `  loss: {` is 9 characters: the kind starts in column 10
    "unknown-loss": (BASE + "backward:\n  loss: {weight: [[1], [2]]}\n", "bad.yaml:5:10: backward.loss: ",
                     ["weight", "did you mean 'weights'"]),
    # `backward: ` is 10 characters: the value starts in column 11
    "not-a-mapping": (BASE + "backward: sum\n", "bad.yaml:4:11: backward: ", ["loss"]),
    # `  dO: [[` is 8 characters: the entry starts in column 9
    "dO-not-a-number": (BASE + "backward:\n  dO: [[abc], [1]]\n", "bad.yaml:5:9: backward.dO row 1, column 1: ", ["abc"]),
    "dO-minus-inf": (BASE + "backward:\n  dO: [[-inf], [1]]\n", "bad.yaml:5:9: backward.dO row 1, column 1: ", ["-inf"]),
    "two-entries": (BASE + "backward: {loss: sum, dO: [[1], [2]]}\n", "bad.yaml:4:11: backward: ", ["dO", "loss"]),
}


@pytest.mark.parametrize("case", sorted(BAD_BACKWARD))
def test_bad_backward_section_is_one_error_line(symattn_cli, tmp_path, case):
    text, place, fragments = BAD_BACKWARD[case]
    (tmp_path / "bad.yaml").write_text(text, "utf-8")
    r = symattn_cli("derive", "bad.yaml", "-f", "json", cwd=tmp_path)
    assert r.exit_code == 1, (r.exit_code, r.stderr, r.exc_info)
    assert r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: " + place), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("case", sorted(BAD_BACKWARD))
def test_bad_backward_section_through_the_api(case):
    text, place, _ = BAD_BACKWARD[case]
    with pytest.raises(SymattnError) as info:
        parse_problem(text, "bad.yaml")
    message = str(info.value)
    assert message.startswith(place), message
    assert "\n" not in message
    where, field, rest = place.split(": ")
    assert rest == ""
    _, line, col = where.split(":")
    assert (info.value.line, info.value.col) == (int(line), int(col))
    assert info.value.field == field


def test_bad_backward_section_through_the_entry_point(symattn_cli, tmp_path):
    text, place, _ = BAD_BACKWARD["dO-shape"]
    (tmp_path / "bad.yaml").write_text(text, "utf-8")
    p = symattn_cli.entry("derive", "bad.yaml", cwd=tmp_path, how="python-m")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert p.stderr.startswith("Error: " + place) and "Traceback" not in p.stderr


def test_bad_backward_section_with_the_flag_is_the_same_error(symattn_cli, tmp_path):
    text, place, _ = BAD_BACKWARD["loss-mean"]
    (tmp_path / "bad.yaml").write_text(text, "utf-8")
    r = symattn_cli("derive", "bad.yaml", "--backward", "-f", "json", cwd=tmp_path)
    assert r.exit_code == 1, (r.exit_code, r.stderr)
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith("Error: " + place)


# ===========================================================================
# 9. Beyond teaching sizes: gradients in decimals, exact on request
# ===========================================================================


def _nine_tokens(tmp_path) -> Path:
    rng = random.Random(9)
    rows = lambda r, c: [[rng.randint(-2, 2) for _ in range(c)] for _ in range(r)]  # noqa: E731
    text = yaml.safe_dump({"X": rows(9, 3), "W_Q": rows(3, 2), "W_K": rows(3, 2), "W_V": rows(3, 2),
                           "mask": "causal", "backward": {"loss": "sum"}})
    path = tmp_path / "nine.yaml"
    path.write_text(text)
    return path


def test_big_gradients_are_shown_in_decimals_and_stay_exact_on_request(symattn_cli, tmp_path):
    path = _nine_tokens(tmp_path)
    r = symattn_cli("derive", path, "-f", "json")
    assert r.exit_code == 0, r.output
    stages = {s["id"]: s for s in json.loads(r.output)["stages"]}
    # 81 scores > EXACT_LIMIT: the long gradients are null in JSON, their decimals are not
    for id in ("dV", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dX"):
        assert stages[id]["exact"] is None, id
        assert all(v is not None for row in stages[id]["approx"] for v in row), id
    # dO (all ones) and dA (rational) are still written exactly
    assert stages["dO"]["exact"] == [["1", "1"]] * 9
    assert stages["dA"]["exact"] is not None
    tex = symattn_cli("derive", path, "-f", "latex")
    assert tex.exit_code == 0 and "decimals only" in tex.output
    # the Python API still builds an exact entry, and it agrees with the decimals
    d = symattn.derive(symattn.load_problem(path))
    exact = d.step("dQ").exact[4, 1]
    assert abs(float(sympy.N(exact, 30)) - stages["dQ"]["approx"][4][1]) < 1e-12


# -- the gradients' values: arb matrices and float64 against mpmath at 60 digits --------------


def _mpmath_relation(d, step, dps):
    """The gradient by its relation with NumericOps (mpmath rows) on the earlier stages' values."""
    from symattn.exact import lazy as exact_module
    from symattn.exact.numeric_ops import NumericOps
    from symattn.numbers.matrices import is_rational
    from symattn import stages

    c = stages.Context(d.problem, step.head)
    ops = NumericOps(dps, d.problem.substitutions)

    def value(key, head=...):
        other = d.step(stages.resolve(key, c, head)[0])
        if is_rational(other.lazy):
            return other.lazy
        if other.kind_of is not None and other.kind_of.gradient and exact_module.qq_entries(other.lazy) is None:
            return _mpmath_relation(d, other, dps)
        return d.evaluate(other.id, dps)

    return ops.grid(step.kind_of.relation(ops, value, c))


def _random_backward_problem(seed: int) -> str:
    import random

    rng = random.Random(seed)
    n, d_model, d_k = rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 3)

    def m(r, c):
        return "[" + ", ".join("[" + ", ".join(f'"{rng.randint(-9, 9)}/{rng.randint(1, 7)}"' for _ in range(c)) + "]"
                               for _ in range(r)) + "]"

    lines = [f"X: {m(n, d_model)}"]
    if rng.random() < 0.3:
        lines.append("heads:")
        for _ in range(2):
            lines += [f"  - W_Q: {m(d_model, d_k)}", f"    W_K: {m(d_model, d_k)}", f"    W_V: {m(d_model, d_k)}"]
        lines.append(f"W_O: {m(2 * d_k, rng.randint(1, 3))}")
    else:
        lines += [f"W_Q: {m(d_model, d_k)}", f"W_K: {m(d_model, d_k)}", f"W_V: {m(d_model, d_k)}"]
    lines.append(rng.choice(["mask: causal", "mask: {sliding-window: 1}", "# no mask"]))
    lines.append(rng.choice(["scale: none", "# the default scale 1/sqrt(d_k)", 'scale: "1/3"']))
    lines.append(rng.choice(["backward: {loss: sum}", f"backward: {{loss: {{weights: {m(n, d_k if 'heads' not in lines else 1)}}}}}"]))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(25))
def test_gradients_on_arb_matrices_and_in_float64_match_mpmath_at_60_digits(seed):
    import mpmath
    import numpy as np

    from symattn import derive
    from symattn.errors import SymattnError
    from symattn.problem.load import parse_problem

    try:
        d = derive(parse_problem(_random_backward_problem(seed), "r.yaml"))
    except SymattnError as exc:
        pytest.skip(str(exc))
    gradients = [s for s in d.steps if s.kind_of is not None and s.kind_of.gradient and d._gradient_balls(s, 60) is not None]
    assert gradients
    for step in gradients:
        reference = _mpmath_relation(d, step, 60)
        with mpmath.workdps(70):
            for i, row in enumerate(reference):
                for j, v in enumerate(row):
                    got = d.entry_values(step.id, 60)(i, j)
                    assert abs(got - v) <= mpmath.mpf(10) ** -50 * max(1, abs(v)), (step.id, i, j, got, v)
        floats = d._float_relation(step)
        if floats is not None:
            expected = np.array([[float(v) for v in row] for row in reference])
            scale = max(1.0, float(np.abs(expected).max()) if expected.size else 1.0)
            assert np.abs(floats - expected).max(initial=0.0) <= 1e-12 * scale, step.id
        approx = d.approx(step.id)
        expected = np.array([[float(v) for v in row] for row in d.evaluate(step.id, 30)])
        scale = max(1.0, float(np.abs(expected).max()) if expected.size else 1.0)
        assert np.abs(approx - expected).max(initial=0.0) <= 1e-12 * scale, step.id
