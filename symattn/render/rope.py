"""What a worked solution shows for RoPE: one token's rotation as a 2×2 block (after ``Q_rot`` and
``K_rot``) and the relative-position property written out exactly (after ``S``), for the LaTeX,
Markdown and HTML blocks, the text renderer and JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..problem import rope as _rope
from .. import stages
from . import prose
from .numbers import tex, text_entry

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


def _context(d: Derivation, step: Step) -> stages.Context:
    return stages.Context(d.problem, step.head)


def _id(d: Derivation, step: Step, name: str) -> str:
    """The id of stage ``name`` as ``step``'s head reads it (a grouped head reads its group's K)."""
    return stages.resolve(name, _context(d, step))[0]


def turn_of(d: Derivation, step: Step) -> "_rope.Turn | None":
    """The 2×2 block a rotated stage shows (None for any other stage or without RoPE)."""
    if d.problem.rope is None or "rotation" not in step.shows:
        return None
    base = "q_pre" if step.key == stages.Q_ROT else "k_pre"  # what was turned: Q, or Q_norm under QK-norm
    return _rope.turn(d.problem.rope, d.step(_id(d, step, base)).lazy, step.lazy, _context(d, step).d_k)


def relative_of(d: Derivation, step: Step) -> "_rope.Relative | None":
    """The relative-position property the scores show (None without RoPE or with one token)."""
    if d.problem.rope is None or "rope_relative" not in step.shows or not step.written_exactly:
        return None  # (scores shown in decimals: their exact rotated entries are too long to read)
    Q, K = (d.step(_id(d, step, name)).lazy for name in ("q_pre", "k_pre"))
    return _rope.relative(d.problem.rope, Q, K, step.lazy, _context(d, step).d_k)


def _column(xs) -> str:
    return "\\begin{pmatrix} " + " \\\\ ".join(xs) + " \\end{pmatrix}"


def _row(xs) -> str:
    return "\\begin{pmatrix} " + " & ".join(xs) + " \\end{pmatrix}"


def _rotation(c: str, s: str) -> str:
    return f"\\begin{{pmatrix}} {c} & -{s} \\\\ {s} & {c} \\end{{pmatrix}}"


def _turn_sentence(d: Derivation, step: Step, t: _rope.Turn) -> str:
    token = prose.literal(step.rows[t.token])
    return (f"One token's rotation as a 2×2 block: token {t.token + 1} ({token}, position ⟦p = {t.token}⟧), "
            f"pair {t.pair + 1} (components {t.a + 1} and {t.b + 1} in the {d.problem.rope.pairing} pairing), "
            f"turned by ⟦{{\\varphi}} = {t.token} \\cdot \\theta_{{{t.pair + 1}}} = {sympy.latex(t.angle)}⟧:")


def _turn_tex(step: Step, t: _rope.Turn) -> list[str]:
    v = "q" if step.key == stages.Q_ROT else "k"
    i = t.token + 1
    lhs = _column([f"{v}^{{\\mathrm{{rot}}}}_{{{i},{t.a + 1}}}", f"{v}^{{\\mathrm{{rot}}}}_{{{i},{t.b + 1}}}"])
    before = _column([f"{v}_{{{i},{t.a + 1}}}", f"{v}_{{{i},{t.b + 1}}}"])
    first = f"{lhs} = " + _rotation("\\cos\\varphi", "\\sin\\varphi") + before
    numbers = (f"= \\begin{{pmatrix}} {tex(t.cos)} & {tex(-t.sin)} \\\\ {tex(t.sin)} & {tex(t.cos)} \\end{{pmatrix}}"
               f"{_column([tex(x) for x in t.x])} = {_column([tex(x) for x in t.out])}")
    return [first, numbers]


def _relative_sentence(step: Step, r: _rope.Relative) -> str:
    q_tok, k_tok = prose.literal(step.rows[r.query]), prose.literal(step.cols[r.key])
    return (f"The property that makes RoPE, for query {r.query + 1} ({q_tok}, position {r.query}) and key "
            f"{r.key + 1} ({k_tok}, position {r.key}): the score of the rotated vectors equals the unrotated "
            f"query times the key turned by the relative angle ⟦({r.key + 1} - {r.query + 1})\\,\\theta⟧ "
            "alone, exactly:")


def _angle_tex(offset: int) -> str:
    return {0: "0", 1: "\\theta", -1: "-\\theta"}.get(offset, f"{offset}\\,\\theta")


def _relative_tex(r: _rope.Relative) -> list[str]:
    i, j = r.query + 1, r.key + 1
    R = f"R({_angle_tex(r.offset)})\\,k_{{{j}}}"
    rot = f"q^{{\\mathrm{{rot}}}}_{{{i}}} \\cdot k^{{\\mathrm{{rot}}}}_{{{j}}}"
    return [
        f"{R} = R({_angle_tex(r.offset)})\\,{_row([tex(x) for x in r.k])}^{{\\top}} = "
        f"{_row([tex(x) for x in r.k_relative])}^{{\\top}}",
        f"q_{{{i}}} \\cdot {R} = {_row([tex(x) for x in r.q])} \\cdot {_row([tex(x) for x in r.k_relative])}",
        f"q_{{{i}}} \\cdot {R} = {tex(r.relative)}",
        f"S_{{{i},{j}}} = {rot} = {tex(r.score)}",
        f"{rot} - q_{{{i}}} \\cdot {R} = {tex(r.difference)}"
        + ("\\quad\\text{(exactly: SymPy simplifies the difference to 0)}" if r.difference == 0 else ""),
    ]


def rope_blocks(d: Derivation, step: Step) -> list[tuple[str, str]]:
    """``(kind, text)`` of the blocks (``para`` prose or ``math`` LaTeX) a step shows for RoPE."""
    t = turn_of(d, step)
    if t is not None:
        return [("para", _turn_sentence(d, step, t))] + [("math", line) for line in _turn_tex(step, t)]
    r = relative_of(d, step)
    if r is not None:
        return [("para", _relative_sentence(step, r))] + [("math", line) for line in _relative_tex(r)]
    return []


def _vec(xs) -> str:
    return "(" + ", ".join(text_entry(x) for x in xs) + ")"


def rope_text(d: Derivation, step: Step) -> list[str]:
    """The same for the text renderer, in plain Unicode."""
    t = turn_of(d, step)
    if t is not None:
        v = "q" if step.key == stages.Q_ROT else "k"
        i = t.token + 1
        return [
            "    " + prose.plain(_turn_sentence(d, step, t)),
            f"      ({v}_rot[{i},{t.a + 1}], {v}_rot[{i},{t.b + 1}]) = [[cos φ, −sin φ], [sin φ, cos φ]]·"
            f"({v}[{i},{t.a + 1}], {v}[{i},{t.b + 1}])",
            f"      = [[{text_entry(t.cos)}, {text_entry(-t.sin)}], [{text_entry(t.sin)}, {text_entry(t.cos)}]]·"
            f"{_vec(t.x)} = {_vec(t.out)}",
        ]
    r = relative_of(d, step)
    if r is not None:
        i, j = r.query + 1, r.key + 1
        angle = prose.text_of(_angle_tex(r.offset))
        exactly = "   (exactly: SymPy simplifies the difference to 0)" if r.difference == 0 else ""
        return [
            "    " + prose.plain(_relative_sentence(step, r)),
            f"      R({angle})·k_{j} = R({angle})·{_vec(r.k)} = {_vec(r.k_relative)}",
            f"      q_{i} · R({angle})·k_{j} = {_vec(r.q)} · {_vec(r.k_relative)} = {text_entry(r.relative)}",
            f"      S[{i},{j}] = q_rot_{i} · k_rot_{j} = {text_entry(r.score)}",
            f"      q_rot_{i} · k_rot_{j} − q_{i} · R({angle})·k_{j} = {text_entry(r.difference)}{exactly}",
        ]
    return []


def rope_json(d: Derivation) -> "dict | None":
    """The rotation's settings and each head's relative-position property, for JSON (0-based)."""
    p = d.problem
    if p.rope is None:
        return None
    out: dict = {"pairing": p.rope.pairing,
                 "base": None if p.rope.base is None else str(p.rope.base),
                 "positions_from": 0, "relative": []}
    thetas = {}
    for step in d.steps:
        if step.key != stages.S:
            continue
        c = _context(d, step)
        thetas[step.head] = [str(t) for t in p.rope.thetas(c.d_k)]
        r = relative_of(d, step)
        if r is not None:
            out["relative"].append({
                "stage": step.id, "query": r.query, "key": r.key, "offset": r.offset,
                "rotated_score": str(r.score), "relative_score": str(r.relative),
                "difference": str(r.difference),
            })
    # θ_1 … θ_{d_k/2}; with several heads, one list per head (their d_k may differ)
    out["angles"] = list(thetas.values()) if p.multi_head else thetas[None]
    return out
