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


def backward_supported(path) -> bool:
    """Whether a worked example takes the generic backward-pass tests here: not with grouped K/V heads,
    whose groups' gradients have their own tests (test_exact_gqa_backward.py), nor through the embeddings' norm (embeddings_norm:, from: {embeddings: true} of a
    BERT layer); nor a block with an MLP or the model's head (mlp:, logits:, from: {block: true}),
    whose backward pass starts from its cross-entropy, not from a loss on O or H, and has its own
    tests (test_block_backward.py, test_block_backward_hf.py); nor learned sinks (sink:), whose
    backward pass is not supported yet; nor linear attention (linear:) nor multi-head latent attention (mla:) nor differential attention (differential:), which have none; nor soft-capping,
    a temperature or QK-norm (softcap:, temperature:, qk_norm:), whose backward pass is refused too."""
    text = path.read_text("utf-8")
    return "kv_heads" not in text and not re.search(r"(?m)^sink:", text) and "embeddings_norm:" not in text and \
        not ("embeddings: true" in text and "layout: bert" in text) and \
        not re.search(r"(?m)^(mlp|logits|linear|mla|differential|softcap|temperature|qk_norm):|block: true|n_kv_head", text)


def is_linear(path) -> bool:
    """Whether a worked example is linear attention (linear:): no scores, no softmax, no A; its own
    tests are in test_exact_linear.py."""
    return re.search(r"(?m)^linear:", path.read_text("utf-8")) is not None


def is_mla(path) -> bool:
    """Whether a worked example is multi-head latent attention (mla:): its Q, K and V are assembled from
    the latent, not X·W; its own tests are in test_exact_mla.py."""
    return re.search(r"(?m)^mla:", path.read_text("utf-8")) is not None


def has_norm(path) -> bool:
    """Whether a worked example has a norm or a residual stream (``norm:``, ``residual:``,
    ``from: {norm: true}``)."""
    return bool(re.search(r"(?m)^(norm|residual|mlp|logits):|norm: true|residual: true|block: true",
                          path.read_text("utf-8")))


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
    if isinstance(mask, dict) and "sink" in mask:  # StreamingLLM: the first k keys and a causal window of w
        k, w = int(mask["sink"]), int(mask["window"])
        return [[j <= i and (j < k or i - j < w) for j in range(n_k)] for i in range(n_q)]
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
# The bound is symattn's own (its cross-check of --backward uses it too); its derivation is in
# symattn/reference/fd_bound.py, and the tests here hold their differences to it.

from symattn.reference.fd_bound import (EXP_ULPS, FLOAT64_UNIT_ROUNDOFF, attention_loss_rounding,  # noqa: E402,F401
                               central_difference_bound)
