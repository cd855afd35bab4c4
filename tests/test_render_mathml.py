"""The web page's MathML, made piece by piece and from shared templates, is what converting
each formula whole with latex2mathml gives (the reference below converts each formula at once,
with no splitting and no template)."""

from __future__ import annotations

from pathlib import Path

import pytest

import symattn
from symattn.render import html, mathml as mathml_module
from symattn.render.mathml import mathml

ROOT = Path(__file__).resolve().parent.parent


def whole(tex: str, display: bool = False) -> str:
    """The formula converted at once: latex2mathml on the rewritten LaTeX, then finished."""
    from latex2mathml.converter import convert

    out = convert(mathml_module._rewritten(tex), display="block" if display else "inline")
    return mathml_module._finished(out, tex)


def outcome(convert, tex: str, display: bool) -> tuple[str, str]:
    """What ``convert`` gives for ``tex``, or the kind of error it raises."""
    try:
        return "math", convert(tex, display)
    except Exception as exc:  # noqa: BLE001
        return "error", type(exc).__name__


def _clear() -> None:
    for f in (mathml, mathml_module._piece, mathml_module._template):
        f.cache_clear()


# Formulas whose numbers' lengths, order or place could fool a template or a split: a
# subscript written after a superscript comes out first; a command or a script takes one digit
# of an unbraced number; a number after \cdot, \approx or = ; sums inside brackets, environments.
TRICKY = [
    r"Z^{(1)}_{3}", r"Z^{(12)}_{3}", r"Z^{(1)}_{345}", r"\dfrac{1 + e^{-2}}{Z^{(2)}_{10}}",
    r"\frac12", r"\frac{1}2", r"\frac-12", r"x^23", r"x_1/23", r"x_{12}/3", r"\sqrt2 + 3", r"\sqrt{2} + 3",
    r"1.5\times 10^{-12}", r"2\times 10^{-5}", r"-0.125", r"- \frac{33}{250}", r"\left(- \frac{1}{8}\right)",
    r"\left(-3\right) \cdot 2 = -6", r"0 \cdot \left(-1\right) = -3", r"a \cdot b = - \frac{12}{5}",
    r"\left( a + b \right) = 2", r"\left\{ 1 + 2 \right\} + 3", r"a \cdots + b", r"\alpha + 1", r"x^ + 1",
    r"\frac = 1", r"\text{a = 1} + 2", r"\operatorname{softmax}(x) = 1 + 2", r"\begin{aligned} a &= 1 \\ b &= 22 \end{aligned}",
    r"{1 \over 2} = 3", r"m_{1} = - \frac{470509147071}{2000000000000}", r"e^{- 1012424061473/2000000000000}",
    r"Q_{11} = x_{1} \cdot W_{Q}[:,1] = \frac{63}{500} \cdot \frac{43}{1000} + \cdots + 1 \cdot 1 = \frac{806001}{1000000}",
    r"o_{1,2} = \sum_k A_{1,k}\, V_{k,2} \approx 1 \cdot \frac{186289}{250000} \approx 0.7452", r"-\infty",
    r"A_{12,3} = \dfrac{e^{\hat{S}_{12,3} - m_{12}}}{Z_{12}} = 0 \approx 0", r"\mkern-3mu 1 + 2", r"\rule{0pt}{2ex} 1 = 1",
]


@pytest.mark.parametrize("display", [False, True])
def test_tricky_formulas_come_out_as_converted_whole(display):
    _clear()
    for _ in range(2):  # the second time round, from the templates the first made
        for tex in TRICKY:
            assert outcome(mathml, tex, display) == outcome(whole, tex, display), tex


def test_a_shape_shared_by_numbers_of_other_lengths_gives_each_its_own():
    _clear()
    first = mathml(r"Q_{1} = \frac{1}{2} \cdot 3")
    other = mathml(r"Q_{123} = \frac{45678}{9} \cdot 3")
    assert first == whole(r"Q_{1} = \frac{1}{2} \cdot 3")
    assert other == whole(r"Q_{123} = \frac{45678}{9} \cdot 3")
    assert "<mn>45678</mn>" in other and "<mn>123</mn>" in other


def _pages() -> list[tuple[str, dict]]:
    examples = sorted((ROOT / "worked_examples").glob("*.yaml"))
    return [(p.name, kw) for p in examples for kw in ({}, {"exercise": True}, {"digits": 3, "max_shown": 3})]


@pytest.mark.parametrize("name,options", _pages(), ids=lambda x: x if isinstance(x, str) else repr(x))
def test_every_formula_of_the_example_pages_is_as_converted_whole(name, options, monkeypatch):
    seen = []

    def recording(tex: str, display: bool = False) -> str:
        out = mathml(tex, display)
        seen.append((tex, display, out))
        return out

    monkeypatch.setattr(html, "mathml", recording)
    d = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / name))
    html.render_html(d, **options)
    assert seen
    for tex, display, out in seen:
        assert out == whole(tex, display), tex


# -- the pieces kept as latex2mathml wrote them (symattn/render/mathml_known.py) ------------------

# The plain pages the kept pieces are made from: random problems of 3-decimal entries, causal and
# unmasked, at the sizes a reader derives (each seed its own numbers, so its own signs and lengths).
KNOWN_SIZES = [(4, 4, 4), (8, 16, 8), (16, 64, 16), (32, 128, 16), (64, 256, 64), (128, 768, 64)]
KNOWN_SEEDS = range(6)


def random_problem_yaml(n: int, d_model: int, d_k: int, seed: int, mask: str) -> str:
    import numpy as np

    rng = np.random.default_rng([seed, n, d_model, d_k])
    mats = {"X": rng.normal(0.0, 1.0, (n, d_model))}
    mats |= {name: rng.normal(0.0, 0.1, (d_model, d_k)) for name in ("W_Q", "W_K", "W_V")}
    rows = {name: ", ".join("[" + ", ".join(f"{x:.3f}" for x in (np.round(r, 3) + 0.0)) + "]" for r in m)
            for name, m in mats.items()}
    return f"title: random {n}\nmask: {mask}\n" + "".join(f"{k}: [{v}]\n" for k, v in rows.items())


def converted_by(d, **options) -> set[tuple[str, str]]:
    """What the web page of ``d`` (cross-checked, as ``symattn derive -f html`` writes it) asks
    latex2mathml for, as (source, mode), with nothing kept and the caches cleared."""
    from latex2mathml.converter import convert
    from symattn.reference.crosscheck import crosscheck

    seen = set()

    def recording(source: str, mode: str) -> str:
        seen.add((source, mode))
        return convert(source, display=mode)

    saved = mathml_module.convert
    mathml_module.convert = recording
    try:
        _clear()
        html.render_html(d, check=crosscheck(d), **options)
    finally:
        mathml_module.convert = saved
        _clear()
    return seen


def write_known(path: Path) -> int:
    """Write symattn/render/mathml_known.py from the pages of the random problems above."""
    from latex2mathml.converter import convert

    seen = set()
    for n, d_model, d_k in KNOWN_SIZES:
        for seed in KNOWN_SEEDS:
            for mask in ("causal", "none"):
                text = random_problem_yaml(n, d_model, d_k, seed, mask)
                seen |= converted_by(symattn.derive(symattn.load_problem(text)))
    lines = ['"""latex2mathml\'s MathML of the pieces every plain page converts (see :mod:`.mathml`), made by',
             "``python tests/test_render_mathml.py`` from the pages of random problems; generated, do not edit.",
             '"""', "", "KNOWN: dict[str, dict[str, str]] = {"]
    for mode in ("inline", "block"):
        lines.append(f"    {mode!r}: {{")
        lines += [f"        {s!r}: {convert(s, display=mode)!r}," for s, m in sorted(seen) if m == mode]
        lines.append("    },")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(seen)


def test_each_kept_piece_is_what_latex2mathml_writes():
    from latex2mathml.converter import convert
    from symattn.render.mathml_known import KNOWN

    assert KNOWN["inline"] and set(KNOWN) == {"inline", "block"}
    for mode, pieces in KNOWN.items():
        for source, out in pieces.items():
            assert out == convert(source, display=mode), source


def test_a_plain_page_needs_no_piece_that_is_not_kept():
    """The kept pieces are not stale: a plain page of numbers not among those they were made from
    (another seed) converts nothing new (run tests/test_render_mathml.py to remake them). A page
    of a few tokens (each weight's every term written, in its own signs) or of some d_k whose
    square root is not whole can: it is converted as before."""
    from symattn.render.mathml_known import KNOWN

    for mask in ("causal", "none"):
        d = symattn.derive(symattn.load_problem(random_problem_yaml(16, 64, 16, 1000, mask)))
        assert {s for s, mode in converted_by(d) if s not in KNOWN[mode]} == set()


def test_a_page_is_the_same_without_the_kept_pieces(monkeypatch):
    from symattn.render import mathml_known

    d = symattn.derive(symattn.load_problem(random_problem_yaml(5, 6, 3, 7, "causal")))
    _clear()
    kept = html.render_html(d)
    monkeypatch.setattr(mathml_known, "KNOWN", {"inline": {}, "block": {}})
    monkeypatch.setattr(mathml_module, "KNOWN", {"inline": {}, "block": {}})
    _clear()
    assert html.render_html(d) == kept
    _clear()


if __name__ == "__main__":
    count = write_known(ROOT / "symattn" / "render" / "mathml_known.py")
    print(f"symattn/render/mathml_known.py: {count} pieces")
