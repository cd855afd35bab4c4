"""``symattn.render(derivation, format, options)`` with one frozen ``RenderOptions``, and the
displays of a derivation, which live on the render side (``symattn.exact`` names no renderer)."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
import types
from pathlib import Path

import pytest

import symattn
from symattn import RenderOptions
from symattn.exact import derivation as exact

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
CAUSAL = EXAMPLES / "causal_4_tokens.yaml"
BACKWARD = EXAMPLES / "backward_causal.yaml"
RENDERERS = {"latex": symattn.render_latex, "markdown": symattn.render_markdown, "text": symattn.render_text,
             "json": symattn.render_json, "html": symattn.render_html}


@pytest.fixture(scope="module")
def causal():
    d = symattn.derive(symattn.load_problem(CAUSAL))
    return d, symattn.crosscheck(d)


def _committed(path: Path) -> str:
    return path.read_bytes().decode("utf-8").replace("\r\n", "\n")


# -- the package, callable -----------------------------------------------------------------------


def test_render_is_the_package_and_callable():
    import symattn.render as package

    assert symattn.render is package is sys.modules["symattn.render"]
    assert isinstance(package, types.ModuleType) and callable(package)
    assert package.render_latex is symattn.render_latex and package.RenderOptions is RenderOptions
    assert {"render", "RenderOptions"} <= set(symattn.__all__) and "render" in dir(symattn)
    from symattn.render import render_html, select  # noqa: F401  (the package's names still import)


def test_the_callable_packages_show_their_functions_signatures():
    """help() and inspect see the function a package calls, every parameter included."""
    import inspect

    import symattn.check
    import symattn.generate
    from symattn.check import check
    from symattn.generate import generate
    from symattn.render import render

    for package, function in ((symattn.render, render), (symattn.check, check), (symattn.generate, generate)):
        assert inspect.signature(package) == inspect.signature(function)
        assert package.__doc__ == sys.modules[package.__name__].__doc__ and package.__doc__  # its own docstring


@pytest.mark.parametrize("example, suffix, fmt", [(CAUSAL, ".tex", "latex"), (CAUSAL, ".md", "markdown"),
                                                  (CAUSAL, ".html", "html"), (BACKWARD, ".tex", "latex"),
                                                  (BACKWARD, ".md", "markdown")])
def test_render_gives_the_committed_worked_solutions(example, suffix, fmt):
    """The committed golden files were written by the renderers before RenderOptions existed."""
    d = symattn.derive(symattn.load_problem(example))
    assert symattn.render(d, fmt, RenderOptions()) == _committed(example.with_suffix(suffix))
    assert symattn.render(d, fmt) == _committed(example.with_suffix(suffix))


# Option sets, as keywords of the old renderers (html's fragment is standalone=False).
OPTION_SETS = [
    {},
    {"digits": 6},
    {"max_shown": 3},
    {"first": "S", "last": "A"},
    {"standalone": False},
    {"exercise": True, "ask": frozenset({"S", "A"})},
    {"exercise": True},
    {"check": True, "digits": 3, "max_shown": 3},
]
TAKES = {"latex": {"standalone", "digits", "check", "max_shown", "first", "last", "exercise", "ask"},
         "markdown": {"digits", "check", "max_shown", "first", "last", "exercise", "ask"},
         "html": {"standalone", "digits", "check", "max_shown", "first", "last", "exercise", "ask"},
         "text": {"digits", "check", "max_shown", "first", "last"},
         "json": {"digits", "check"}}


def _old_keywords(fmt: str, options: dict, check) -> dict:
    keywords = {k: (check if k == "check" else v) for k, v in options.items()}
    if fmt == "html" and "standalone" in keywords:
        keywords["fragment"] = not keywords.pop("standalone")
    return keywords


CASES = [(fmt, options) for fmt in RENDERERS for options in OPTION_SETS
         if set(options) <= TAKES[fmt] | ({"standalone"} if fmt in ("latex", "html") else set())]


@pytest.mark.parametrize("fmt, options", CASES, ids=[f"{f}-{','.join(o) or 'defaults'}" for f, o in CASES])
def test_each_format_equals_its_renderer_for_the_same_options(causal, fmt, options):
    d, check = causal
    values = {k: (check if k == "check" else v) for k, v in options.items()}
    expected = RENDERERS[fmt](d, **_old_keywords(fmt, options, check))
    assert symattn.render(d, fmt, RenderOptions(**values)) == expected
    assert symattn.render(d, fmt, **values) == expected  # the old keywords
    assert symattn.render.render(d, fmt, RenderOptions(**values)) == expected


@pytest.mark.parametrize("fmt", ["latex", "markdown", "html", "text"])
def test_the_options_reach_the_document(causal, fmt):
    """Each option changes what is written, as it says (so none is dropped on the way)."""
    d, check = causal
    plain = symattn.render(d, fmt)
    assert symattn.render(d, fmt, RenderOptions(digits=6)) != plain
    assert "0.880797" in symattn.render(d, fmt, RenderOptions(digits=6)) and "0.880797" not in plain  # 1/(1+e^-2)
    short = symattn.render(d, fmt, RenderOptions(first="S_scaled", last="S_scaled"))
    assert "Softmax" not in short and "Softmax" in plain
    with_check = symattn.render(d, fmt, RenderOptions(check=check))
    assert with_check != plain and "agrees with" in with_check and "agrees with" not in plain
    if fmt != "text":
        sheet = symattn.render(d, fmt, RenderOptions(exercise=True, ask={"S"}))
        assert "Exercise: " in sheet and "Exercise: " not in plain
    if fmt in ("latex", "html"):
        fragment = symattn.render(d, fmt, RenderOptions(standalone=False))
        assert len(fragment) < len(plain) and ("\\documentclass" in plain) == (fmt == "latex")
        assert "\\documentclass" not in fragment and "<html" not in fragment


def test_max_shown_elides(causal):
    d, _ = causal
    big = symattn.derive(symattn.load_problem(EXAMPLES / "large" / "causal_64_tokens.yaml"))
    few = symattn.render(big, "text", RenderOptions(max_shown=3, first="A", last="A"))
    many = symattn.render(big, "text", RenderOptions(max_shown=8, first="A", last="A"))
    assert "…" in few and "…" in many and len(few) < len(many)
    assert few.count("\n") < many.count("\n")


def test_json_ignores_no_option_it_is_given(causal):
    d, check = causal
    assert symattn.render(d, "json", RenderOptions(check=check)) == symattn.render_json(d, check=check)
    assert '"crosscheck"' in symattn.render(d, "json", check=check)


# -- RenderOptions: frozen, checked --------------------------------------------------------------


def test_options_are_frozen_and_hashable():
    options = RenderOptions(digits=5, exercise=True, ask=["S", "A"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.digits = 6
    assert options.ask == frozenset({"S", "A"}) and isinstance(options.ask, frozenset)
    assert options == RenderOptions(digits=5, exercise=True, ask={"A", "S"})
    assert hash(options) == hash(RenderOptions(digits=5, exercise=True, ask={"A", "S"}))
    assert dataclasses.replace(options, digits=7).digits == 7 and options.digits == 5


@pytest.mark.parametrize("keywords, field", [
    ({"digits": 0}, "digits"), ({"digits": 51}, "digits"), ({"digits": 2.5}, "digits"), ({"digits": True}, "digits"),
    ({"digits": "4"}, "digits"), ({"max_shown": 0}, "max_shown"), ({"max_shown": -3}, "max_shown"),
    ({"max_shown": 3.0}, "max_shown"), ({"standalone": "yes"}, "standalone"), ({"exercise": 1}, "exercise"),
    ({"first": 3}, "first"), ({"last": ["A"]}, "last"), ({"exercise": True, "ask": "S"}, "ask"),
    ({"exercise": True, "ask": {1}}, "ask"), ({"ask": {"S"}}, "ask"), ({"exercise": True, "ask": {"Sx"}}, "ask"),
    ({"check": "passed"}, "check"),
])
def test_bad_options_are_refused_naming_the_option(keywords, field):
    with pytest.raises(ValueError) as error:
        RenderOptions(**keywords)
    message = str(error.value)
    assert message.startswith(field) and "\n" not in message, message


def test_a_hostile_value_is_not_echoed_in_full():
    with pytest.raises(ValueError) as error:
        RenderOptions(digits="9" * 100_000)
    assert len(str(error.value)) < 200


def test_an_unknown_stage_to_ask_for_gets_a_suggestion():
    with pytest.raises(ValueError, match=r"^ask: 'S_scald' is not a stage \(did you mean 'S_scaled'\?\)"):
        RenderOptions(exercise=True, ask={"S_scald"})


def test_render_refuses_what_it_cannot_follow(causal):
    d, _ = causal
    with pytest.raises(ValueError, match=r"^unknown format 'pdf'; choose one of latex, markdown, myst, text, json, html$"):
        symattn.render(d, "pdf")
    with pytest.raises(ValueError, match=r"^text does not take exercise: an exercise sheet is LaTeX, Markdown, MyST or HTML$"):
        symattn.render(d, "text", RenderOptions(exercise=True))
    with pytest.raises(ValueError, match=r"^json does not take max_shown, first: JSON holds every stage in full$"):
        symattn.render(d, "json", max_shown=3, first="S")
    with pytest.raises(ValueError, match="options must be a symattn.RenderOptions"):
        symattn.render(d, "latex", {"digits": 3})
    with pytest.raises(ValueError, match="^digits must be"):
        symattn.render(d, "latex", RenderOptions(), digits=0)  # keywords are checked as options are
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'max_show' \(did you mean 'max_shown'\?\)"):
        symattn.render(d, "latex", max_show=3)
    with pytest.raises(ValueError, match="^digits must be"):
        symattn.render_latex(d, digits=0)  # the old renderers build RenderOptions, so they check too


def test_keywords_replace_the_options_values(causal):
    d, _ = causal
    assert symattn.render(d, "text", RenderOptions(digits=3), digits=6) == symattn.render_text(d, digits=6)


# -- the displays: on the render side, through symattn.derive ------------------------------------


def test_symattn_derive_makes_a_derivation_that_shows_itself(causal):
    d, _ = causal
    fresh = symattn.derive(symattn.load_problem(CAUSAL))
    assert type(fresh) is symattn.Derivation and isinstance(fresh, exact.Derivation)
    assert all(type(s) is symattn.Step for s in fresh.steps)
    text = repr(fresh)
    assert text.startswith("<symattn.Derivation: ") and "cross-check: not run" in text
    assert fresh._repr_markdown_() == symattn.render_markdown(fresh)
    assert fresh._repr_html_() == symattn.render_html(fresh, fragment=True)
    assert fresh._repr_latex_().startswith("$$ \\operatorname{Attention}")
    check = symattn.crosscheck(fresh)
    assert fresh.last_check is check
    assert "cross-check: passed" in repr(fresh)
    assert fresh._repr_html_() == symattn.render_html(fresh, check=check, fragment=True) != symattn.render_html(
        fresh, fragment=True)
    step = fresh.step("A")
    assert repr(step).startswith("<symattn.Step A: ") and "\n" not in repr(step)
    assert "Z_2 = 1 + exp(-2)" in str(step) and "⟦" in step.why and "⟦" not in step.why_text
    assert step._repr_latex_() in step._repr_markdown_()


def test_the_exact_derivation_has_no_display(causal):
    d, _ = causal
    plain = exact.derive(symattn.load_problem(CAUSAL))
    assert type(plain) is exact.Derivation and type(plain.steps[0]) is exact.Step
    for name in ("_repr_html_", "_repr_markdown_", "_repr_latex_"):
        assert not hasattr(plain, name) and not hasattr(plain.steps[0], name)
    assert plain.ids == d.ids and all(a.exact == b.exact for a, b in zip(plain.steps, d.steps))
    # the renderers read it all the same: the displays are only how it shows itself
    assert symattn.render(plain, "markdown") == symattn.render(d, "markdown")


def test_last_check_is_a_declared_field_a_copy_does_not_inherit(causal):
    d, check = causal
    assert "last_check" in {f.name for f in dataclasses.fields(exact.Derivation)}
    assert d.last_check is check
    copy = dataclasses.replace(d, steps=d.steps)
    assert copy.last_check is None and "cross-check: not run" in repr(copy)
    assert copy == d  # the check is not part of what the derivation is


LATER = ("symattn.reference", "symattn.render", "symattn.check", "symattn.generate", "symattn.cli")


def _later_imports(source: str) -> list[str]:
    """The modules of the later packages that ``source``, a module of symattn/exact/, imports
    anywhere: at the top, inside a function, under TYPE_CHECKING."""
    package = ["symattn", "exact"]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names = [".".join(base + ([node.module] if node.module else []))]
            names += [f"{names[0]}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [f"{node.lineno} {n}" for n in names if n.startswith(LATER)]
    return found


def test_exact_imports_nothing_from_the_later_packages():
    found = {path.name: _later_imports(path.read_text("utf-8")) for path in sorted((ROOT / "symattn" / "exact").glob("*.py"))}
    assert not any(found.values()), found


@pytest.mark.parametrize("source", [
    "def f():\n    from ..render import display\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..reference.crosscheck import CrossCheck\n",
    "from .. import render\n",
    "import symattn.render.html\n",
])
def test_the_import_check_sees_every_kind_of_import(source):
    assert _later_imports(source)
    assert not _later_imports("from . import ops\nfrom ..stages import core\nimport mpmath\n")


def test_one_escape_per_language():
    """Every renderer and report takes its escapes from symattn.render.escape."""
    defined = []
    for path in sorted((ROOT / "symattn").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.FunctionDef) and re.fullmatch(r"_?escape(_\w+)?", node.name):
                defined.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert defined == ["symattn/render/escape.py:escape_tex", "symattn/render/escape.py:escape_html",
                       "symattn/render/escape.py:escape_markdown", "symattn/render/escape.py:escape_myst"], defined
