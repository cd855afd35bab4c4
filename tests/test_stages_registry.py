"""The stage registry: one row and one relation per stage, read by derive, evaluate and check."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import mpmath
import pytest

import symattn
from _reference import backward_supported
from symattn import stages
from symattn.problem.model import SUM_LOSS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("*.yaml"))
PACKAGE = ROOT / "symattn"


def with_backward(path):
    p = symattn.load_problem(path)
    if p.backward is not None:
        return p
    return dataclasses.replace(p, backward=SUM_LOSS)


@pytest.fixture(scope="module", params=[p for p in EXAMPLES if "symbolic" not in p.stem], ids=lambda p: p.stem)
def derivation(request):
    if not backward_supported(request.param):  # grouped K/V heads, the embeddings' norm: no backward pass
        return symattn.derive(symattn.load_problem(request.param))
    return symattn.derive(with_backward(request.param))


def test_ids_are_made_and_split_in_one_place():
    assert stages.stage_id("A") == "A"
    assert stages.stage_id("S_scaled", 3) == "head3.S_scaled"
    assert stages.split_id("head12.dS_masked") == (12, "dS_masked")
    assert stages.split_id("O") == (None, "O")
    assert stages.split_id("header.A") == (None, "header.A")  # not a head prefix


def test_every_key_is_unique_and_every_section_known():
    keys = [k.key for k in stages.KINDS]
    assert len(keys) == len(set(keys))
    sections = {s.key for s in stages.SECTIONS}
    problem = symattn.load_problem(ROOT / "worked_examples" / "two_heads.yaml")
    c = stages.Context(problem)
    for kind in stages.KINDS:
        assert stages.section_of(kind, c) in sections, kind.key


def test_the_plan_is_the_contract_order():
    """JSON lists the stages in this order (../shared/spec/cli-and-output.md)."""
    p = symattn.load_problem(ROOT / "worked_examples" / "causal_4_tokens.yaml")
    assert [x.id for x in stages.plan(p)] == [
        "X", "W_Q", "W_K", "W_V", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]


def test_relations_read_only_their_declared_inputs(derivation):
    """``Kind.inputs`` is what the relation reads: the outline states those as given, and
    check's follow-through rests on them."""
    for step in derivation.steps:
        kind = step.kind_of
        if step.given or kind.relation is None:
            continue
        c = stages.Context(derivation.problem, step.head)
        read = []

        def value(key, head=..., c=c):
            ids = stages.resolve(key, c, head)
            read.extend(ids)
            return derivation.step(ids[0]).value

        from symattn.exact.exact_ops import ExactOps

        kind.relation(ExactOps(expand=not kind.gradient), value, c)
        assert set(read) <= set(stages.input_ids(kind, c)), (step.id, read)


def test_one_relation_gives_the_exact_and_the_numeric_value(derivation):
    """Each computed stage's relation, run at 30 digits on its inputs' values, gives the
    stage's exact value evaluated at 30 digits: the relation derive used is the one that
    evaluates."""
    for step in derivation.steps:
        if step.given or step.kind_of.relation is None:
            continue
        exact = derivation.evaluate(step.id, 30)
        numeric = derivation.by_relation(step, 30)
        for row_e, row_n in zip(exact, numeric):
            for e, n in zip(row_e, row_n):
                if e == mpmath.ninf:
                    assert n == mpmath.ninf, step.id
                else:
                    assert abs(e - n) <= mpmath.mpf(10) ** -24 * max(1, abs(e)), (step.id, e, n)


def test_an_unknown_stage_is_a_library_error_with_a_suggestion():
    d = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / "causal_4_tokens.yaml"))
    with pytest.raises(symattn.SymattnError, match=r"no stage 'S_scald' \(did you mean 'S_scaled'\?\)"):
        d.step("S_scald")


def test_select_reports_in_library_wording():
    from symattn.render import select

    d = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / "causal_4_tokens.yaml"))
    with pytest.raises(symattn.SymattnError, match="stage A comes after S") as info:
        select(d, "A", "S")
    assert "--" not in str(info.value)
    with pytest.raises(symattn.SymattnError, match="did you mean 'S_scaled'"):
        select(d, "S_scaledd", None)


def test_the_cli_suggests_a_stage_name(symattn_cli, tmp_path):
    result = symattn_cli("derive", "--from", "S_scald")
    assert result.exit_code == 2
    assert "did you mean 'S_scaled'" in result.output
    result = symattn_cli("derive", "--exercise", "--ask", "Q,Ss")
    assert result.exit_code == 2
    assert "did you mean 'S'" in result.output


# -- nothing outside the registry spells a stage id -----------------------------------------

# The problem's data model and the reader's modules for the top-level fields, the layer's matrices
# and the backward pass (dO: ...) read the problem file, and generate writes it, whose fields (X,
# W_Q, ...) share their names with the input stages; they name fields, not stages (as
# checkpoints/layouts.py, which fills them from a checkpoint for the from: field). The registry's
# own modules spell the ids by right.
_FIELD_MODULES = {"problem/model.py", "problem/reader/fields.py", "problem/reader/document.py",
                  "problem/reader/layer.py", "problem/reader/passes.py", "problem/reader/block.py",
                  "problem/reader/linear.py", "problem/reader/qk_norm.py", "problem/reader/mla.py",
                  "problem/reader/differential.py",
                  "problem/checkpoints/layouts.py",
                  "generate/exercises.py", "generate/block.py", "generate/mla.py"} | {
    f"stages/{name}.py" for name in
    ("__init__", "ids", "kinds", "registry", "rows", "norms", "norm_backward", "formulas", "why", "relations",
     "outline", "mlp", "block_backward", "linear", "mla", "differential")}
# generated tables of LaTeX pieces and their MathML ('K' there is a letter to typeset, not a stage)
_DATA_MODULES = {"render/mathml_known.py"}
_NAMES = set(stages.NAMES) | {k.key for k in stages.KINDS}


def _string_constants(tree: ast.AST):
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_no_module_outside_the_registry_spells_a_stage_id():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in _FIELD_MODULES | _DATA_MODULES:
            continue
        tree = ast.parse(path.read_text("utf-8"))
        for node in _string_constants(tree):
            text = node.value
            if text in _NAMES or text.startswith("head") and text[4:5].isdigit() or text in ("head", "head."):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
                if any(part.endswith("head") for part in parts):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: an f-string making a head prefix")
    assert not found, "\n".join(found)
