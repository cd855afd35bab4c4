"""The library under ``symattn generate`` and the pass flags: ``symattn.generate``,
``symattn.write_exercises``, ``symattn.with_backward``, ``with_tiling`` and ``with_decode``.

Each library call is held to what the real command line (``python -m symattn``, run by
``tests/_child.py``) writes for the same options: the same problem files byte for byte, the
same ``index.csv``, the same stages and exact values.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

import symattn
from symattn import SymattnError

from _child import ROOT, run_cli

EXAMPLES = ROOT / "worked_examples"

# (command-line options, the same as library keywords)
CASES = [
    (["--count", "3", "--seed", "5"], dict(seed=5)),
    (["--count", "4", "--seed", "2", "--level", "medium", "--tokens", "3", "--mask", "none"],
     dict(seed=2, level="medium", tokens=3, mask="none")),
    (["--count", "2", "--level", "hard", "--heads", "2", "--d-k", "2", "--mask", "padding:1", "--range", "-1..2"],
     dict(level="hard", heads=2, d_k=2, mask="padding:1", range=(-1, 2))),
    (["--count", "3", "--cross", "3", "--mask", "sliding-window:2", "--no-scale", "--words", "a b c d e f g"],
     dict(cross=3, mask="sliding-window:2", scale=False, words="a b c d e f g")),
    # 1×1 problems: 16 exist, so seeds collide and spare seeds are taken
    (["--count", "6", "--tokens", "1", "--d-model", "1", "--d-k", "1", "--d-v", "1", "--seed", "1"],
     dict(tokens=1, d_model=1, d_k=1, d_v=1, seed=1)),
    (["--count", "3", "--from", str(EXAMPLES / "causal_4_tokens.yaml"), "--vary", "inputs"],
     dict(base=EXAMPLES / "causal_4_tokens.yaml", vary="inputs")),
]


def _command(args: list[str]) -> str:
    return " ".join(["symattn generate", *(shlex.quote(a) for a in args)])


@pytest.mark.parametrize("args, options", CASES, ids=[" ".join(a[:6]) for a, _ in CASES])
def test_generate_and_write_exercises_match_the_command_line(tmp_path: Path, args, options) -> None:
    cli_args = args + ["--out-dir", "cli"]
    run = run_cli(["generate", *cli_args], cwd=tmp_path)
    assert run.code == 0, run.err
    count = int(args[1])
    problems = symattn.generate(count, **options, command=_command(cli_args))
    written = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert len(problems) == count and len(written) == count + 1  # the variants and index.csv
    for k, p in enumerate(problems, 1):
        assert isinstance(p, symattn.Problem) and p.variant == k
        assert p.to_yaml().encode("utf-8") == (tmp_path / "cli" / f"variant-{k:02d}.yaml").read_bytes()
    paths = symattn.write_exercises(problems, tmp_path / "lib")
    assert sorted(p.name for p in paths) == written
    for name in written:
        assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    seeds = [int(line.split(",")[1]) for line in (tmp_path / "cli" / "index.csv").read_text().splitlines()[1:]]
    assert [p.seed for p in problems] == seeds


def test_spare_seeds_are_taken_when_variants_collide() -> None:
    problems = symattn.generate(6, tokens=1, d_model=1, d_k=1, d_v=1, seed=1)
    seeds = [p.seed for p in problems]
    assert len({p.to_yaml().split("title:")[1] for p in problems}) == 6  # no two alike (titles differ too)
    assert len({str(p.X.tolist() + p.W_Q.tolist() + p.W_K.tolist() + p.W_V.tolist()) for p in problems}) == 6
    assert seeds[0] == 1 and any(s >= 7 for s in seeds), seeds  # 1 + 6 onwards are the spare seeds


@pytest.mark.parametrize("args, options", [(["--seed", "7"], dict(seed=7)),
                                           (["--seed", "3", "--heads", "3", "--level", "medium", "--d-k", "1"],
                                            dict(seed=3, heads=3, level="medium", d_k=1)),
                                           (["--from", str(EXAMPLES / "causal_4_tokens.yaml"), "--seed", "2"],
                                            dict(base=symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml"),
                                                 seed=2))])
def test_one_problem_matches_the_command_line_without_count(args, options) -> None:
    run = run_cli(["generate", *args])
    assert run.code == 0, run.err
    (p,) = symattn.generate(**options, command=_command(args))
    assert p.variant is None and p.to_yaml() == run.out


def test_sheets_match_the_command_line(tmp_path: Path) -> None:
    args = ["--count", "2", "--seed", "4", "--out-dir", "cli", "--sheets", "html"]
    assert run_cli(["generate", *args], cwd=tmp_path).code == 0
    symattn.write_exercises(symattn.generate(2, seed=4, command=_command(args)), tmp_path / "lib", sheets="html")
    names = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert "variant-02-solution.html" in names and names == sorted(p.name for p in (tmp_path / "lib").iterdir())
    for name in names:
        assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


def test_the_default_header_is_the_call() -> None:
    (p,) = symattn.generate(seed=3, level="medium", tokens=3)
    assert p.to_yaml().splitlines()[0] == "# Made by: symattn.generate(seed=3, level='medium', tokens=3)"
    assert symattn.generate(2)[1].to_yaml().splitlines()[0] == "# Made by: symattn.generate(2)  (variant 2 of 2, seed 1)"


def test_a_line_break_in_an_option_stays_in_the_header_comment(tmp_path: Path) -> None:
    run = run_cli(["generate", "--words", "the\ncat\u2028sat"], cwd=tmp_path)
    assert run.code == 0, run.err
    # YAML ends a line at U+2028 too: each piece of the argument is a comment line of its own
    assert run.out.splitlines()[:3] == ["# Made by: symattn generate --words 'the", "#   cat", "#   sat'"]
    assert symattn.load_problem(run.out).tokens == ("the", "cat", "sat", "t4")


def test_import_and_generate_in_a_fresh_process() -> None:
    done = subprocess.run([sys.executable, "-c", "import symattn; print(len(symattn.generate(2)))"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})
    assert done.returncode == 0 and done.stdout == "2\n", done.stderr


@pytest.mark.parametrize("options, message", [
    (dict(count=0), "count must be from 1 to 500, not 0"),
    (dict(count="3"), "count must be a whole number, not '3'"),
    (dict(seed=-1), "seed must be 0 or more, not -1"),
    (dict(seed=10 ** 50), "seed has more than 40 digits"),
    (dict(level="expert"), "unknown level 'expert'; choose easy, medium or hard"),
    (dict(tokens=2.0), "tokens must be a whole number, not 2.0"),
    (dict(tokens=17), "--tokens must be from 1 to 16 for a hand exercise, not 17"),
    (dict(mask="casual"), "unknown mask 'casual' (did you mean 'causal'?)"),
    (dict(range=(2, 1)), "--range 2..1: the low end is above the high end"),
    (dict(range=3), "range is (low, high), two whole numbers, not 3"),
    (dict(vary="both"), "vary is 'weights' or 'inputs', not 'both'"),
    (dict(scale="no"), "scale is True or False, not 'no'"),
    (dict(words=[1, 2]), "words are text"),
    (dict(base=EXAMPLES / "causal_4_tokens.yaml", tokens=3), "tokens comes from the base problem"),
    (dict(d_k=2), "d_k = 2 is not a perfect square"),
])
def test_bad_options_raise_one_line(options, message) -> None:
    with pytest.raises(SymattnError) as info:
        symattn.generate(**options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_write_exercises_refuses_what_is_not_generated(tmp_path: Path) -> None:
    plain = symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml")
    changed = symattn.with_backward(symattn.generate()[0])
    for problems, message in (([], "needs a list of problems"), ([plain], "problem 1 was not made by symattn.generate"),
                              ([changed], "problem 1 was not made by symattn.generate")):
        with pytest.raises(SymattnError, match=message):
            symattn.write_exercises(problems, tmp_path / "out")
    with pytest.raises(SymattnError, match="changed after symattn.generate made it"):
        changed.to_yaml()
    with pytest.raises(SymattnError, match="sheets is 'pdf' or 'html'"):
        symattn.write_exercises(symattn.generate(), tmp_path / "out", sheets="docx")
    assert not (tmp_path / "out").exists()


def test_write_exercises_never_overwrites_without_force(tmp_path: Path) -> None:
    problems = symattn.generate(2)
    symattn.write_exercises(problems, tmp_path)
    (tmp_path / "index.csv").write_text("mine\n")
    with pytest.raises(SymattnError, match="would overwrite variant-01.yaml, variant-02.yaml, index.csv"):
        symattn.write_exercises(problems, tmp_path)
    assert (tmp_path / "index.csv").read_text() == "mine\n"
    symattn.write_exercises(problems, tmp_path, force=True)
    assert (tmp_path / "index.csv").read_text() == "variant,seed,file\n1,0,variant-01.yaml\n2,1,variant-02.yaml\n"


# -- the passes: the same stages and values as --backward, --tiled and --decode ----------------------


def _json_stages(args: list[str]) -> list[tuple[str, object]]:
    import json

    run = run_cli(["derive", *args, "--format", "json", "--no-check"])
    assert run.code == 0, run.err
    return [(s["id"], s["exact"]) for s in json.loads(run.out)["stages"]]


def _library_stages(p) -> list[tuple[str, object]]:
    import json

    d = symattn.derive(p)
    return [(s["id"], s["exact"]) for s in json.loads(symattn.render_json(d))["stages"]]


@pytest.mark.parametrize("example, flags, call", [
    ("causal_4_tokens.yaml", ["--backward"], lambda p: symattn.with_backward(p)),
    ("backward_causal.yaml", ["--backward"], lambda p: symattn.with_backward(p)),
    ("causal_4_tokens.yaml", ["--tiled", "2"], lambda p: symattn.with_tiling(p, 2)),
    ("causal_4_tokens.yaml", ["--decode", "3"], lambda p: symattn.with_decode(p, 3)),
    ("causal_4_tokens.yaml", ["--tiled", "3", "--backward"], lambda p: symattn.with_backward(symattn.with_tiling(p, 3))),
])
def test_passes_derive_what_the_flags_derive(example, flags, call) -> None:
    path = EXAMPLES / example
    assert _library_stages(call(symattn.load_problem(path))) == _json_stages([str(path), *flags])


def test_with_backward_takes_a_loss_as_the_file_does(tmp_path: Path) -> None:
    p = symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml")
    rows = [[1, "1/2"], [Fraction(-3, 4), "0.25"], ["exp(2)", -1], [0, sympy.Rational(5, 3)]]
    text = (EXAMPLES / "causal_4_tokens.yaml").read_text("utf-8")
    for kind in ("weights", "target"):
        file = tmp_path / f"{kind}.yaml"
        file.write_text(text + f"backward:\n  loss: {{{kind}: [[1, 1/2], [-3/4, 0.25], [exp(2), -1], [0, 5/3]]}}\n", "utf-8")
        via_file = symattn.load_problem(file)
        via_call = symattn.with_backward(p, {kind: rows})
        assert via_call.backward == via_file.backward
        assert via_call.backward.matrix[1, 1] == sympy.Rational(1, 4) and via_call.backward.matrix[2, 0] == sympy.E ** 2
        assert _library_stages(via_call) == _json_stages([str(file)])
    assert symattn.with_backward(p, "sum").backward.kind == "sum"
    given = symattn.load_problem(EXAMPLES / "backward_causal.yaml")
    assert symattn.with_backward(given) is given  # its own backward: section is kept
    assert symattn.with_backward(given, "sum").backward.kind == "sum"  # a loss given replaces it


@pytest.mark.parametrize("loss, message", [
    ("mean", "loss: unknown loss 'mean'"),
    ({"weights": [[1, 2]]}, "loss.weights: 1 row given, but the output O is 4×2: it needs one entry per output entry: a list of 4 rows"),
    ({"target": [[1, 2, 3]] * 4}, "loss.target row 1: 3 entries given, but the output O is 4×2"),
    ({"weights": [[0.1, 1]] * 4}, "loss.weights row 1, column 1: 0.1 is a binary float"),
    ({"weights": [[1, "x^"]] * 4}, "loss.weights row 1, column 2:"),
    ({"dO": [[1] * 4] * 4}, "unknown loss 'dO'"),
    (3, "the loss is sum"),
])
def test_with_backward_refuses_a_bad_loss_in_one_line(loss, message) -> None:
    p = symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml")
    with pytest.raises(SymattnError) as info:
        symattn.with_backward(p, loss)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("call, message", [
    (lambda p: symattn.with_tiling(p, 0), "--tiled: the block must be a whole number of keys, 1 or more, not 0"),
    (lambda p: symattn.with_tiling(p, "2"), "the block must be a whole number of keys, 1 or more, not '2'"),
    (lambda p: symattn.with_decode(p, 9), "--decode: token 9 is out of range"),
    (lambda p: symattn.with_decode(p, "3"), "the token to decode is a whole number from 1"),
])
def test_with_tiling_and_with_decode_refuse_in_one_line(call, message) -> None:
    p = symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml")
    with pytest.raises(SymattnError) as info:
        call(p)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_old_names_in_the_cli_still_work() -> None:
    from symattn.cli import with_backward, with_tiling

    assert with_backward is symattn.with_backward and with_tiling is symattn.with_tiling
