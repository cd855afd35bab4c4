"""symattn's own sentences: math marked ⟦…⟧ and typeset as math in LaTeX and Markdown, Unicode in
text; and how a derivation and a step show themselves in a terminal and a notebook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import symattn
from symattn.problem.load import parse_problem
from symattn.render import prose
from _reference import backward_supported

EXAMPLES = Path(__file__).resolve().parent.parent / "worked_examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("**/*.yaml"))
BACKWARD = EXAMPLES / "backward_causal.yaml"
BIG = EXAMPLES / "large" / "causal_64_tokens.yaml"
SYMBOLIC = EXAMPLES / "symbolic_two_tokens.yaml"
LOSSES = ["sum", {"weights": [[1, 0], [0, 1], [1, -1]]}, {"target": [[1, 0], [0, 1], [1, 1]]}]


def derive(path, backward=None):
    p = symattn.load_problem(path)
    if backward is not None:
        data = yaml.safe_load(Path(path).read_text("utf-8"))
        data["backward"] = {"loss": backward}
        # read as if from the example's folder, where the files it names (from: a checkpoint) are
        p = parse_problem(yaml.safe_dump(data), str(path), base_dir=Path(path).resolve().parent)
    return symattn.derive(p)


def all_derivations():
    for path in EXAMPLE_FILES:
        if path.parent.name == "large":
            continue
        yield path.stem, derive(path)
        if not path.stem.startswith("rope") and backward_supported(path):  # no backward through RoPE here, nor of grouped heads
            yield path.stem + "+sum", derive(path, "sum")
    for loss in LOSSES:
        yield f"backward {loss}", derive(BACKWARD, loss)


def sentences(d):
    """Every sentence of prose a worked solution of ``d`` prints (why texts, paragraphs)."""
    from symattn.render.blocks import blocks

    for block in blocks(d):
        if block.kind == "step":
            yield block.extra
        elif block.kind == "para":
            yield block.text


def test_every_marked_piece_has_a_plain_text_form():
    for name, d in all_derivations():
        for sentence in sentences(d):
            text = prose.plain(sentence)
            assert not re.search(r"[\\{}⟦⟧]", text), (name, sentence, text)


def test_backward_prose_has_no_pseudo_math_underscores():
    """The 13 places that printed a_ij, dO_i, Σ_k, ∂a_j/∂ŝ_k ... as text now mark them as math."""
    d = derive(BACKWARD)
    latex = symattn.render_latex(d)
    markdown = symattn.render_markdown(d)
    for line in latex.splitlines():
        if line.startswith("\\paragraph") or line.startswith("The softmax Jacobian"):
            outside = re.sub(r"\\\(.*?\\\)", "", line)
            assert "\\_" not in outside and "_" not in outside, line
    assert "\\(a_{ij}\\)" in latex and "\\(dO_i\\)" in latex
    assert "\\(\\partial a_j/\\partial \\hat{s}_k = a_j(\\delta_{jk} - a_k)\\)" in latex
    for line in markdown.splitlines():
        if line.startswith("**") or line.startswith("The softmax Jacobian"):
            outside = re.sub(r"\$[^$]+\$", "", line)
            assert "\\_" not in outside, line
    assert "$d\\hat{S}_{ij} = a_{ij}\\bigl(dA_{ij} - \\sum_k a_{ik}\\,dA_{ik}\\bigr)$" in markdown
    text = symattn.render_text(d)
    assert "dŜᵢⱼ = aᵢⱼ(dAᵢⱼ − Σₖ aᵢₖ dAᵢₖ)" in text
    assert "∂aⱼ/∂ŝₖ = aⱼ(δⱼₖ − aₖ)" in text
    assert "a_ij" not in text.split("Step 10", 1)[1].split("dŜ[i,j]")[0]  # the why texts, not the formulas


def test_unscaled_gradient_is_written_without_a_factor_of_one():
    d = derive(BACKWARD)  # scale: none
    step = d.step("dS")
    assert step.formula == "dS = d\\hat{S}" and step.formula_text == "dS = dŜ"
    assert "dS = 1" not in symattn.render_latex(d)
    scaled = derive(EXAMPLES / "causal_4_tokens.yaml", "sum").step("dS")
    assert scaled.formula == "dS = \\frac{1}{\\sqrt{d_k}}\\, d\\hat{S}"


def test_prose_sets_symbols_alike():
    """X is math like W_Q; indices i, j are math; concat is an operator name, never italic letters."""
    d = derive(EXAMPLES / "two_heads.yaml", "sum")
    latex = symattn.render_latex(d)
    assert "Each row of \\(X\\) is one token" in latex and "times \\(W_Q\\)" in latex
    assert "\\(d\\operatorname{concat}\\)" in latex
    assert not re.search(r"(?<![\\a-z{])concat(?![a-z}])", "\n".join(
        line for line in latex.splitlines() if "\\(" in line and "concatenat" not in line))
    scores = derive(EXAMPLES / "causal_4_tokens.yaml")
    assert "Entry \\((i, j)\\) is the dot product of query \\(i\\) with key \\(j\\)" in symattn.render_latex(scores)


def test_symbolic_softmax_does_not_claim_nonpositive_exponents():
    symbolic = derive(SYMBOLIC).step("A").why
    assert "≤" not in symbolic and "\\le" not in symbolic
    assert "can be positive" in symbolic
    numeric = derive(EXAMPLES / "causal_4_tokens.yaml").step("A").why
    assert "keeps every exponent ⟦\\le 0⟧" in numeric


def test_user_text_cannot_open_math(tmp_path):
    text = yaml.safe_dump({
        "tokens": ["⟦\\input{/etc/passwd}⟧", "b"], "X": [[1, 0], [0, 1]], "W_Q": [[1, 0], [0, 1]],
        "W_K": [[1, 0], [0, 1]], "W_V": [[1], [2]], "mask": "causal", "backward": {"loss": "sum"},
    }, allow_unicode=True)
    d = symattn.derive(symattn.load_problem(text))
    assert "\\input{/etc" not in symattn.render_latex(d)
    assert "$\\input" not in symattn.render_markdown(d)


def test_plain_text_forms():
    assert prose.text_of("q_i \\cdot k_j") == "qᵢ · kⱼ"
    assert prose.text_of("j \\le i + (n_k - n_q)") == "j ≤ i + (n_k − n_q)"  # n_q has no Unicode subscript
    assert prose.text_of("L = \\tfrac{1}{2}\\|O - T\\|^2") == "L = ½‖O − T‖²"
    assert prose.text_of("A^{\\top} dO") == "Aᵀ dO"
    with pytest.raises(ValueError):
        prose.text_of("\\unknowncommand")


# -- a derivation and a step in a terminal and a notebook ---------------------------------------


def test_big_derivation_summary_is_short():
    d = derive(BIG)
    text = repr(d)
    assert len(text.encode()) < 2000
    assert max(len(line) for line in text.splitlines()) <= 200
    assert d.problem.title in text and "n_q = 64" in text and "S_scaled" in text
    assert "symattn.crosscheck(d)" in text  # how to run the check


def test_summary_elides_a_long_stage_list_and_reports_the_check():
    d = derive(EXAMPLES / "two_heads.yaml", "sum")
    text = repr(d)
    assert "more)" in text and d.ids[-1] in text and d.ids[0] in text
    symattn.crosscheck(d)
    after = repr(d)
    assert "cross-check: passed" in after and "finite differences" in after
    assert max(len(line) for line in after.splitlines()) <= 200


def test_derivation_displays():
    d = derive(EXAMPLES / "causal_4_tokens.yaml")
    assert d._repr_markdown_() == symattn.render_markdown(d)
    latex = d._repr_latex_()
    assert latex.startswith("$$") and latex.endswith("$$") and "\\section" not in latex
    assert "O \\approx" in latex


def test_gradient_step_shows_its_normaliser_form():
    d = derive(BACKWARD)
    step = d.step("dS_masked")
    assert "Z_{2}^{2}" in step._repr_latex_()
    assert "Z_2²" in str(step)
    markdown = step._repr_markdown_()
    assert markdown.startswith("**Back through the softmax** (dS\\_masked).")
    assert "$a_{ij}$" not in markdown or "$$" in markdown  # the why's math is inline math
    assert "≈" not in markdown and "\\approx" in markdown  # its decimals too


def test_jacobian_is_written_over_z_squared_and_equals_diag_a_minus_a_a_t():
    import sympy

    from symattn.render.entries import jacobian_form, jacobian_row

    for d in (derive(BACKWARD), derive(EXAMPLES / "causal_dk2.yaml", "sum")):
        step = d.step("dS_masked")
        i = jacobian_row(step)
        row = step.jacobian[i]
        weights = [row.weight(j) for j in range(len(row.raw))]
        for j in range(len(weights)):
            for k in range(len(weights)):
                form = jacobian_form(row, i, j, k)
                value = form.value if not form.over else form.over[0].numerator / row.normaliser ** 2
                expected = weights[j] * ((1 if j == k else 0) - weights[k])
                assert sympy.simplify(value - expected) == 0, (j, k)
                assert (not form.over) == (value == 0)
    assert "\\dfrac{e^{-1}}{Z_{2}^{2}}" in symattn.render_latex(derive(BACKWARD)).split("J^{(2)}")[1].split("\\]")[0]
