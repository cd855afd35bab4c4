"""FlashAttention's online (tiled) softmax: the block-by-block recurrence, exactly.

References written here: the recurrence again in NumPy float64 (as the kernels run it, and
without the rescale for the common mistake), the output A·V by SymPy from the derivation's own
weights with the difference simplified by ``sympy.simplify``, and the worked example's numbers by
hand.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn import stages
from symattn.check import load_answers, mark
from symattn.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "tiled_softmax.yaml"
E = sympy.E


def _problem(text: str, tmp_path: Path, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return symattn.load_problem(path), path


def online_softmax(Z: np.ndarray, V: np.ndarray, block: int, rescale: bool = True):
    """The recurrence row by row in float64, written again here: m and l after every block, acc after the last."""
    n_q, n_k = Z.shape
    starts = list(range(0, n_k, block))
    M = np.full((n_q, len(starts)), -np.inf)
    L = np.zeros((n_q, len(starts)))
    ACC = np.zeros((n_q, V.shape[1]))
    for i in range(n_q):
        m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])
        for b, start in enumerate(starts):
            keys = range(start, min(start + block, n_k))
            m_new = max([m] + [Z[i, j] for j in keys])
            if m_new == -np.inf:  # nothing allowed yet: nothing changes
                M[i, b], L[i, b] = m, l
                continue
            factor = 0.0 if m == -np.inf else (np.exp(m - m_new) if rescale else 1.0)
            terms = {j: (0.0 if Z[i, j] == -np.inf else np.exp(Z[i, j] - m_new)) for j in keys}
            l = factor * l + sum(terms.values())
            acc = factor * acc + sum(t * V[j] for j, t in terms.items())
            m = m_new
            M[i, b], L[i, b] = m, l
        ACC[i] = acc
    return M, L, ACC


def _f(m) -> np.ndarray:
    return np.array([[-np.inf if x == -sympy.oo else float(x) for x in row] for row in m.tolist()], dtype=float)


# -- the worked example, by hand ---------------------------------------------------------


def test_the_worked_example_by_hand():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    # scores of row 4 (on): q = (1, 1) against the keys, causal: (1, 1, 2, 0, −∞); row 5: (0, 1, 1, 0, 2)
    m = d.step(stages.M_TILED).exact
    assert list(m.row(3)) == [1, 2, 2] and list(m.row(4)) == [1, 1, 2] and list(m.row(0)) == [0, 0, 0]
    l = d.step(stages.L_TILED).exact
    # row 4: block 1 gives e^0 + e^0 = 2; block 2 rescales by e^{1−2}: 2e^{-1} + e^0 + e^{-2}
    assert l[3, 0] == 2
    assert sympy.simplify(l[3, 1] - (2 * E**-1 + 1 + E**-2)) == 0
    # row 5: 1 + e^{-1}, then 2 + 2e^{-1} (no new maximum), then rescaled by e^{-1} and + e^0 for key 5
    assert sympy.simplify(l[4, 2] - ((2 + 2 * E**-1) * E**-1 + 1)) == 0
    acc = d.step(stages.ACC_TILED).exact
    # row 5: v = (1,0),(0,1),(1,1),(2,0),(0,2); e^{s_j − 2}: e^{-2}, e^{-1}, e^{-1}, e^{-2}, 1
    assert sympy.simplify(acc[4, 0] - (E**-2 * 1 + E**-1 * 1 + E**-2 * 2)) == 0
    assert sympy.simplify(acc[4, 1] - (E**-1 + E**-1 + 2)) == 0
    O, O_tiled = d.step(stages.O).exact, d.step(stages.O_TILED).exact
    assert all(sympy.simplify(O_tiled[i, j] - O[i, j]) == 0 for i in range(5) for j in range(2))


def test_every_format_shows_the_recurrence(tmp_path):
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    text = symattn.render_text(d)
    assert "Row 4 (on)" in text and "exp(m⁽ᵇ⁻¹⁾ − m⁽ᵇ⁾)" in text
    assert "O^tiled − O = 0 exactly" in text
    tex = symattn.render_latex(d)
    assert "\\begin{array}{c|c|c|c|c|c}" in tex and "e^{m^{(b-1)} - m^{(b)}}" in tex
    assert "O^{\\text{tiled}} - O = 0" in tex
    md = symattn.render_markdown(d)
    assert "\\begin{array}{c|c|c|c|c|c}" in md and "\\text{(exactly)}" in md
    from symattn.render.html import render_html

    page = render_html(d)
    assert page.count('class="matrix plain tiles"') == 3  # rows 1, 4 and 5 (tiling.rows)
    for name in (stages.M_TILED, stages.L_TILED, stages.ACC_TILED, stages.O_TILED):
        assert f'data-stage="{name}"' in page
    data = json.loads(symattn.render_json(d))
    recurrence = next(s for s in data["stages"] if s["id"] == stages.O_TILED)["recurrence"]
    assert [r["row"] for r in recurrence] == [0, 3, 4]  # 0-based in JSON
    row4 = recurrence[1]["blocks"]
    assert [b["keys"] for b in row4] == [[0, 1], [2, 3], [4]]
    assert [b["rescale"] for b in row4] == ["0", "exp(-1)", "1"]
    assert recurrence[1]["difference"] == ["0", "0"]
    assert row4[1]["approx"]["l"] == pytest.approx(2 * np.exp(-1) + 1 + np.exp(-2))


# -- exact equality with A·V on random problems, and NumPy's recurrence -------------------


def _random_problem(rng: random.Random) -> str:
    n_q, n_k = rng.randint(1, 4), rng.randint(1, 5)
    d_k, d_v = rng.randint(1, 3), rng.randint(1, 2)

    def matrix(r, c):
        return [[rng.choice(["-2", "-1", "0", "1", "2", "1/2", "-3/2"]) for _ in range(c)] for _ in range(r)]

    if rng.random() < 0.4:  # a padding-style mask, at least one key per row
        mask = [[rng.random() < 0.6 for _ in range(n_k)] for _ in range(n_q)]
        for row in mask:
            row[rng.randrange(n_k)] = True
        mask = [[int(x) for x in row] for row in mask]
    else:
        mask = rng.choice(["none", "causal-bottom-right"] if n_k >= n_q else ["none"])
    problem = {"Q": matrix(n_q, d_k), "K": matrix(n_k, d_k), "V": matrix(n_k, d_v), "mask": mask,
               "scale": rng.choice(["auto", "none"]), "tiling": {"block": rng.randint(1, n_k + 1)}}
    return yaml.safe_dump(problem)


@pytest.mark.parametrize("seed", range(12))
def test_tiled_output_equals_AV_exactly_on_random_problems(seed, tmp_path):
    rng = random.Random(seed)
    p, _ = _problem(_random_problem(rng), tmp_path)
    d = symattn.derive(p)
    O, O_tiled = d.step(stages.O).exact, d.step(stages.O_TILED).exact
    for i in range(O.rows):
        for j in range(O.cols):
            assert sympy.simplify(O_tiled[i, j] - O[i, j]) == 0, (seed, i, j)
    # ℓ after the last block is the softmax normaliser: Σ_j e^{ŝ_j − max}, by SymPy from the masked scores
    Z = d.step(stages.S_MASKED).exact
    l = d.step(stages.L_TILED).exact
    for i in range(Z.rows):
        row = [x for x in Z.row(i) if x != -sympy.oo]
        top = max(row, key=lambda x: float(x))
        assert sympy.simplify(l[i, l.cols - 1] - sum(sympy.exp(x - top) for x in row)) == 0
    # the recurrence in NumPy, written here, from NumPy's own masked scores
    Zf, Vf = _f(Z), _f(d.step(stages.V).exact)
    M, L, ACC = online_softmax(Zf, Vf, p.tiling.block)
    np.testing.assert_array_equal(np.isinf(M), np.isinf(d.approx(stages.M_TILED)))
    finite = np.isfinite(M)
    np.testing.assert_allclose(d.approx(stages.M_TILED)[finite], M[finite], rtol=1e-12)
    np.testing.assert_allclose(d.approx(stages.L_TILED), L, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d.approx(stages.ACC_TILED), ACC, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d.approx(stages.O_TILED), ACC / L[:, -1:], rtol=1e-12, atol=1e-14)
    # and the cross-check (symattn's own NumPy reference) agrees stage by stage
    assert symattn.crosscheck(d).passed


def test_an_entirely_masked_block_changes_nothing(tmp_path):
    p, _ = _problem("Q: [[1], [1]]\nK: [[1], [2], [3], [0]]\nV: [[1], [2], [3], [4]]\n"
                    "mask: [[0, 0, 1, 1], [1, 0, 0, 1]]\nscale: none\ntiling: {block: 2}\n", tmp_path)
    d = symattn.derive(p)
    m, l, acc = (d.step(k).exact for k in (stages.M_TILED, stages.L_TILED, stages.ACC_TILED))
    # row 1: keys 1, 2 masked: m stays −∞, ℓ and acc stay 0; then block 2 as if it were the first
    assert m[0, 0] == -sympy.oo and l[0, 0] == 0
    assert m[0, 1] == 3 and sympy.simplify(l[0, 1] - (1 + E**-3)) == 0
    assert sympy.simplify(acc[0, 0] - (3 + 4 * E**-3)) == 0
    # row 2: key 2 and 3 masked: block 2 adds only key 4 (score 0 below the maximum 1)
    assert list(m.row(1)) == [1, 1]
    assert sympy.simplify(l[1, 1] - (1 + E**-1)) == 0
    assert symattn.crosscheck(d).passed  # NumPy's −∞ meets the exact −∞ in the same place
    text = symattn.render_text(d)
    assert "O^tiled − O = 0 exactly" in text


def test_heads_each_get_their_tiled_stages(tmp_path):
    p, _ = _problem(yaml.safe_dump({
        "X": [[1, 0], [0, 1], [1, 1]], "W_O": [[1, 0], [0, 1], [1, 1]], "mask": "causal",
        "heads": [{"W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1], [2]]},
                  {"W_Q": [[1], [1]], "W_K": [[2], [0]], "W_V": [[0, 1], [1, 0]]}],
        "tiling": {"block": 2}}), tmp_path)
    d = symattn.derive(p)
    for h in (1, 2):
        tiled, o = d.step(stages.stage_id(stages.O_TILED, h)).exact, d.step(stages.stage_id(stages.O, h)).exact
        assert all(sympy.simplify(tiled[i, j] - o[i, j]) == 0 for i in range(3) for j in range(o.cols))
    assert symattn.crosscheck(d).passed


# -- marking -----------------------------------------------------------------------------


def _rounded(values, places: int = 4):
    return [["-inf" if x == -np.inf else f"{x:.{places}f}" for x in row] for row in np.asarray(values)]


def _example_arrays():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    Z, V = _f(d.step(stages.S_MASKED).exact), _f(d.step(stages.V).exact)
    return d, Z, V


def test_a_forgotten_rescale_is_named(tmp_path):
    d, Z, V = _example_arrays()
    M, L, ACC = online_softmax(Z, V, 2, rescale=False)
    answers = {stages.M_TILED: _rounded(M), stages.L_TILED: _rounded(L), stages.ACC_TILED: _rounded(ACC),
               stages.O_TILED: _rounded(ACC / L[:, -1:])}
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(answers))
    marking = mark(d, load_answers(path, d)).as_dict()
    by_id = {s["id"]: s for s in marking["stages"]}
    assert by_id[stages.M_TILED]["status"] == "right"
    for name in (stages.L_TILED, stages.ACC_TILED):
        assert by_id[name]["status"] == "wrong", name
        assert "forgotten rescale" in by_id[name]["diagnosis"], (name, by_id[name].get("diagnosis"))
        assert by_id[name]["diagnosis_detail"]["kind"] == "mistake"
    # the output divides the student's own acc by their own ℓ: right by follow-through
    assert by_id[stages.O_TILED]["status"] == "follows"
    assert by_id[stages.O_TILED]["follows_from"] == [stages.ACC_TILED, stages.L_TILED]
    # the output alone, without the rescale: wrong, and the mistake is named
    path.write_text(yaml.safe_dump({stages.O_TILED: answers[stages.O_TILED]}))
    alone = mark(d, load_answers(path, d)).as_dict()["stages"][0]
    assert alone["status"] == "wrong" and "forgotten rescale" in alone["diagnosis"]


def test_right_answers_pass_and_follow_through_carries_a_wrong_maximum(tmp_path):
    d, Z, V = _example_arrays()
    M, L, ACC = online_softmax(Z, V, 2)
    right = {stages.M_TILED: _rounded(M), stages.L_TILED: _rounded(L), stages.ACC_TILED: _rounded(ACC),
             stages.O_TILED: _rounded(ACC / L[:, -1:])}
    path = tmp_path / "right.yaml"
    path.write_text(yaml.safe_dump(right))
    assert mark(d, load_answers(path, d)).passed
    # each block's own maximum instead of the running one: row 3's block 3 holds only masked keys
    own = np.array([[max(Z[i, j] for j in range(s, min(s + 2, 5))) for s in (0, 2, 4)] for i in range(5)])
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump({stages.M_TILED: _rounded(own)}))
    own_mark = mark(d, load_answers(path, d)).as_dict()["stages"][0]
    assert own_mark["status"] == "wrong" and "own maximum" in own_mark["diagnosis"]
    # a maximum missed in row 5's last block (1 instead of 2): ℓ computed right from it follows
    m_used = M.copy()
    m_used[4, 2] = 1.0
    L2 = np.zeros_like(L)  # the recurrence from the student's maxima, written here
    for i in range(5):
        m_prev, l = -np.inf, 0.0
        for b, s in enumerate((0, 2, 4)):
            m = m_used[i, b]
            if m == -np.inf:
                L2[i, b] = l
                continue
            factor = 0.0 if m_prev == -np.inf else np.exp(m_prev - m)
            l = factor * l + sum(0.0 if Z[i, j] == -np.inf else np.exp(Z[i, j] - m) for j in range(s, min(s + 2, 5)))
            L2[i, b] = l
            m_prev = m
    assert L2[4, 2] == pytest.approx(2 + 2 * np.exp(-1) + np.e)
    path = tmp_path / "follow.yaml"
    path.write_text(yaml.safe_dump({stages.M_TILED: _rounded(m_used), stages.L_TILED: _rounded(L2)}))
    by_id = {s["id"]: s for s in mark(d, load_answers(path, d)).as_dict()["stages"]}
    assert by_id[stages.M_TILED]["status"] == "wrong"
    assert by_id[stages.M_TILED]["wrong"][0]["row"] == 4 and by_id[stages.M_TILED]["wrong"][0]["col"] == 2
    assert by_id[stages.L_TILED]["status"] == "follows"
    assert by_id[stages.L_TILED]["follows_from"] == [stages.M_TILED]


# -- the command line and bad input --------------------------------------------------------


def test_the_tiled_option_adds_the_stages(capsys):
    problem = str(ROOT / "worked_examples" / "bert_unmasked.yaml")
    assert main(["derive", problem, "--tiled", "2", "-f", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ids = [s["id"] for s in data["stages"]]
    assert ids[-4:] == [stages.M_TILED, stages.L_TILED, stages.ACC_TILED, stages.O_TILED]
    assert data["crosscheck"]["passed"] is True
    o = next(s for s in data["stages"] if s["id"] == stages.O)["approx"]
    o_tiled = next(s for s in data["stages"] if s["id"] == stages.O_TILED)["approx"]
    np.testing.assert_allclose(o_tiled, o, rtol=1e-15)
    assert [r["row"] for r in data["stages"][-1]["recurrence"]] == [0, 1, 2]  # every row by default
    assert main(["derive", problem, "--tiled", "0"]) == 2
    assert "Invalid value for '--tiled'" in capsys.readouterr().err


def test_the_worked_rows_are_elided_like_a_matrix(tmp_path, capsys):
    n = 10
    p, path = _problem(yaml.safe_dump({"Q": [[i % 3] for i in range(n)], "K": [[i % 2] for i in range(n)],
                                       "V": [[i] for i in range(n)], "mask": "causal", "tiling": {"block": 4}}),
                       tmp_path)
    assert main(["derive", str(path), "-f", "text", "--max-shown", "4"]) == 0
    out = capsys.readouterr().out
    assert "Row 1 (t_1)" in out and "Row 2 (t_2)" in out and "Row 10 (t_10)" in out
    assert "Row 3 (t_3)" not in out and "keys 1 to 4; keys 5 to 8; keys 9, 10" in out and "the rows in between are worked the same way" in out


@pytest.mark.parametrize("tiling, where, message", [
    ("{block: 0}", "4:17", "tiling.block: the block size must be a whole number ≥ 1, not '0'"),
    ("{block: 2.5}", "4:17", "tiling.block: the block size must be a whole number ≥ 1, not '2.5'"),
    ("{block: two}", "4:17", "not 'two'"),
    ("{rows: [1]}", "4:9", "tiling: tiling: needs block: B"),
    ("{block: 1, rows: [0]}", "4:27", "tiling.rows item 1: a query row must be a whole number ≥ 1, not '0'"),
    ("{block: 1, rows: [2, 5]}", "4:30", "tiling.rows item 2: row 5 is out of range: the problem has 2 queries (rows 1 to 2)"),
    ("{block: 1, rows: [2, 2]}", "4:30", "tiling.rows item 2: row 2 is given twice"),
    ("{block: 1, rows: 2}", "4:26", "tiling.rows: rows is a list of query rows counted from 1"),
    ("2", "4:9", "tiling: tiling: needs block: B"),
])
def test_bad_tiling_is_one_located_error(tiling, where, message, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(f"Q: [[1, 0], [0, 1]]\nK: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\ntiling: {tiling}\n")
    assert main(["derive", str(path), "-f", "json"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {path}:{where}: "), err
    assert message in err[0]


def test_tiling_with_symbols_is_refused(tmp_path, capsys):
    path = tmp_path / "sym.yaml"
    path.write_text("symbols: [a]\nQ: [[a]]\nK: [[1], [2]]\nV: [[1], [2]]\ntiling: {block: 1}\n")
    assert main(["derive", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"{path}:5:1: tiling: the tiled softmax needs numbers" in err[0]


def test_check_marks_the_tiled_stages_with_the_option(tmp_path, capsys):
    problem = str(ROOT / "worked_examples" / "bert_unmasked.yaml")
    d = symattn.derive(symattn.load_problem(problem))
    Z, V = _f(d.step(stages.S_MASKED).exact), _f(d.step(stages.V).exact)
    M, L, ACC = online_softmax(Z, V, 2)
    answers = tmp_path / "a.yaml"
    answers.write_text(yaml.safe_dump({stages.M_TILED: _rounded(M), stages.L_TILED: _rounded(L)}))
    assert main(["check", problem, str(answers), "--tiled", "2", "-f", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["status"] for s in data["stages"]] == ["right", "right"]
    # without the option the problem has no tiled stage: one Error line naming the answer
    assert main(["check", problem, str(answers)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"{answers}:1:1: l_tiled is a stage of the online (tiled) softmax" in err[0]
    assert "mark with --tiled B" in err[0]


def test_torch_check_runs_beside_the_tiled_stages(capsys):
    pytest.importorskip("torch")
    assert main(["derive", str(EXAMPLE), "--check", "torch", "-f", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["crosscheck"]["passed"] is True and data["crosscheck"]["torch"]["passed"] is True
    assert data["crosscheck"]["per_stage"][stages.O_TILED] < 1e-12
