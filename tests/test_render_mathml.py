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
