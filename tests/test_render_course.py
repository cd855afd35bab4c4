"""The course features end to end: PDFs, large matrices, shading, labels, exercise sheets,
step selection, plots, the PDF compile path, Jupyter and text elision.

Expected values (stage headings, matrices, weights) are worked out here from the
problem files themselves with NumPy/SymPy, not read back from symattn.

LaTeX is compiled with the real ``pdflatex``. Without it these tests are
skipped, except on CI (the environment variable ``CI`` set), where a missing
pdflatex is a failure. matplotlib is optional: the plot tests skip without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import sympy
import yaml

import symattn
import symattn.render.pdf
from _child import SymattnCli

ROOT = Path(__file__).resolve().parent.parent
# One worker of pytest-xdist runs this file: the 64-token derivation (the big fixture) is made once.
pytestmark = pytest.mark.xdist_group("course")
EXAMPLES = ROOT / "worked_examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("**/*.yaml"))  # large/ too
FOUR = EXAMPLES / "causal_4_tokens.yaml"
TWO_HEADS = EXAMPLES / "two_heads.yaml"
QKV_GIVEN = EXAMPLES / "qkv_given.yaml"
BIG = EXAMPLES / "large" / "causal_64_tokens.yaml"

PDFLATEX = shutil.which("pdflatex")
PDFTOTEXT = shutil.which("pdftotext")
LATEXMK = shutil.which("latexmk")
PDFLATEX_FLAGS = ["-no-shell-escape", "-halt-on-error", "-interaction=nonstopmode"]

# The walk-through's stage titles, in order (the contract of the worked solution).
STAGE_TITLES = (
    "The input",
    "Project to queries, keys and values",
    "Transpose the keys",
    "Score every query against every key",
    "Scale the scores",
    "Apply the mask",
    "Softmax on each row",
    "Weighted sum of the values",
)
GIVEN_INPUT_TITLE = "The input: queries, keys and values given"
ROPE_TITLE = "Rotate the queries and keys (RoPE)"
# Which stage ids each stage title shows (for pairing an exercise sheet with its solution).
STAGE_KINDS = {
    "The input": {"X", "context"},
    GIVEN_INPUT_TITLE: {"Q", "K", "V"},
    "Project to queries, keys and values": {"Q", "K", "V"},
    ROPE_TITLE: {"Q_rot", "K_rot"},
    "Transpose the keys": {"K_T"},
    "Score every query against every key": {"S"},
    "Scale the scores": {"S_scaled"},
    "Apply the mask": {"M", "S_masked"},
    "Softmax on each row": {"A"},
    "Weighted sum of the values": {"O"},
    "Concatenate the heads": {"concat"},
    "Output projection": {"O"},
}
HEADING_RE = re.compile(r"(?:Head \d+ · )?Step \d+: .+")


# -- helpers ------------------------------------------------------------------------------


def need_pdflatex() -> str:
    if PDFLATEX is None:
        if os.environ.get("CI"):
            pytest.fail("pdflatex is not installed, and CI must have it (apt-get install texlive-latex-base texlive-latex-recommended)")
        pytest.skip("pdflatex is not installed")
    return PDFLATEX


def need_pdftotext() -> str:
    if PDFTOTEXT is None:
        pytest.skip("pdftotext is not installed")
    return PDFTOTEXT


CLI = SymattnCli()  # for sheet_pdf; a test takes the symattn_cli fixture


class _Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2 booleans (true/false only), as symattn reads them: the token ``on`` stays a word."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def raw(path: Path) -> dict:
    """The problem file's fields, read independently of symattn."""
    return yaml.load(path.read_text("utf-8"), Loader=_Yaml12Loader)


def derivation_of(path: Path):
    return symattn.derive(symattn.load_problem(path))


def norm(text: str) -> str:
    """pdftotext's output made comparable: ligatures split (NFKC), dots unified, whitespace runs one space."""
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\u22c5", "·").replace("\u2219", "·").replace("\u2019", "'")
    return " ".join(text.split())


def pdf_lines(pdf: Path) -> list[str]:
    """The PDF's text (pdftotext -layout), line by line, each normalised."""
    done = subprocess.run(
        [need_pdftotext(), "-layout", "-enc", "UTF-8", str(pdf), "-"], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return [norm(line) for line in done.stdout.decode("utf-8").splitlines()]


def headings_in(lines: list[str]) -> list[str]:
    return [line for line in lines if HEADING_RE.fullmatch(line)]


def section(lines: list[str], title_part: str) -> list[str]:
    """The lines from the first heading holding ``title_part`` up to the next heading."""
    start = next(k for k, line in enumerate(lines) if HEADING_RE.fullmatch(line) and title_part in line)
    end = next((k for k in range(start + 1, len(lines)) if HEADING_RE.fullmatch(lines[k])), len(lines))
    return lines[start:end]


BACKWARD_TITLES = (  # the backward pass (issue 9), after the forward stages
    "Back through the weighted sum",
    "Back through the softmax",
    "Back through the scaling",
    "Back to the queries and keys",
)


def expected_headings(problem: dict) -> list[str]:
    """The stage headings of a worked solution, from the problem's fields alone."""
    forward = _forward_headings(problem)
    if "backward" not in problem:
        return forward
    backward_titles = BACKWARD_TITLES + (("Back through the rotation",) if "rope" in problem else ())
    norm = problem.get("norm")
    post = norm is not None and norm.get("place") == "post"
    # behind a post norm the gradient goes back through it first; in front of the attention, dX
    # comes back through the norm (and "Back to the input" has only a context's gradient)
    upstream = ["Backward: the upstream gradient"]
    if (problem["backward"] or {}).get("loss") == "cross-entropy":  # back through the head and the MLP first
        upstream = _block_backward_headings(_from_fields(problem)) + ["Back through the attention's residual"] * (not post)
    upstream += ["Back through the norm and the residual (post-norm)"] if post else []
    kind = "RMSNorm" if norm is not None and norm.get("type") == "rmsnorm" else "LayerNorm"
    back = ["Back to the input"] if norm is None or post or "context" in problem else []
    back += [f"Back through the norm ({kind})"] if norm is not None and not post else []
    if "heads" in problem:  # through the output projection, then each head in turn, then back to the input
        assert "Q" not in problem
        n = int(re.match(r"Step (\d+): (Output projection|The residual)", forward[-1]).group(1)) + 1
        out = [f"Step {k}: {t}" for k, t in enumerate(upstream + ["Back through the output projection"], n)]
        n += len(out)
        per_head = ["This head's upstream gradient", *backward_titles, "Back to the projection weights"]
        for h in range(1, len(problem["heads"]) + 1):
            out += [f"Head {h} · Step {k}: {t}" for k, t in enumerate(per_head, n)]
        return forward + out + [f"Step {k}: {t}" for k, t in enumerate(back, n + len(per_head))]
    n = len(forward) + 1
    titles = [*upstream, *backward_titles]
    if "Q" not in problem:
        titles += ["Back to the projection weights", *back]
    return forward + [f"Step {k}: {t}" for k, t in enumerate(titles, n)]


def _block_backward_headings(problem: dict) -> list[str]:
    """The steps back from the cross-entropy (issue 31): the loss, the unembedding, the norms and the MLP."""
    def kind(norm: dict) -> str:
        return "RMSNorm" if norm.get("type") == "rmsnorm" else "LayerNorm"

    out = ["Backward: back through the loss and the softmax", "Back through the unembedding"]
    final = problem["logits"].get("norm")
    out += [f"Back through the final norm ({kind(final)})"] if final else []
    mlp = problem.get("mlp")
    if mlp is not None:
        norm = mlp.get("norm")
        post = bool(norm) and norm.get("place") == "post"
        out.append(f"Back through the norm and the MLP's residual (post-norm, {kind(norm)})" if post else
                   "Back through the MLP's residual")
        out.append("Back through the MLP")
        out += [f"Back through the MLP's norm ({kind(norm)})"] if norm and not post else []
    return out


def _from_fields(problem: dict) -> dict:
    """A ``from:`` layer's fields as the headings see them: several heads (every head with
    ``heads: all``, or with the residual, whose stream needs W_O), the layout's norm, the residual."""
    spec = problem.get("from")
    if not spec:
        return problem
    problem = dict(problem)
    count = spec.get("n_head", 0) if spec["heads"] == "all" else len(spec["heads"])
    if count > 1 or spec.get("residual"):
        problem["heads"] = [None] * count
    if spec.get("norm"):
        problem["norm"] = {"type": "rmsnorm" if spec["layout"] == "llama" else "layernorm",
                           **({"place": "post"} if spec["layout"] == "bert" else {})}
    if spec.get("residual"):
        problem["residual"] = True
    if spec.get("embeddings") and spec["layout"] != "llama":  # the positions; bert's token types and LayerNorm
        problem["positions"] = True
        if spec["layout"] == "bert":
            problem.update(token_types=True, embeddings_norm={"type": "layernorm"})
    if spec["layout"] == "llama":  # RoPE, and K/V heads shared in groups when there are fewer
        problem["rope"] = True
        if spec.get("n_kv_head", spec.get("n_head")) != spec.get("n_head"):
            problem["kv_heads"] = spec["n_kv_head"]
    if spec.get("block"):  # the whole layer: its norm, the residual, its second norm and its MLP
        norm = {"type": "rmsnorm" if spec["layout"] == "llama" else "layernorm",
                **({"place": "post"} if spec["layout"] == "bert" else {})}
        problem.setdefault("norm", norm)
        problem.update(residual=True, heads=[None] * count,
                       mlp={"norm": norm, **({"W_gate": None} if spec["layout"] == "llama" else {})})
    if isinstance(problem.get("logits"), dict) and problem["logits"].get("from"):
        problem["logits"] = {**problem["logits"], "norm": {"type": "rmsnorm" if spec["layout"] == "llama"
                                                            else "layernorm"}}
    return problem


def _block_headings(problem: dict) -> list[str]:
    """The steps of the MLP and of the model's head (issue 31), after the residual stream."""
    out = []
    mlp, logits = problem.get("mlp"), problem.get("logits")
    if mlp is not None:
        norm = mlp.get("norm")
        kind = "RMSNorm" if norm and norm.get("type") == "rmsnorm" else "LayerNorm"
        post = bool(norm) and norm.get("place") == "post"
        out += [f"Normalise the residual stream ({kind})"] * (bool(norm) and not post)
        gated = {"silu": "SwiGLU", "gelu": "GeGLU", "gelu-tanh": "GeGLU, tanh form"}.get(mlp.get("activation", "silu"))
        out.append(f"The MLP (gated: {gated})" if "W_gate" in mlp else "The MLP")
        out.append(f"The residual sum and its norm (post-norm, {kind})" if post else
                   "Add the MLP's output to the residual stream")
    if logits is not None:
        norm = logits.get("norm")
        out += [f"The final norm ({'RMSNorm' if norm.get('type') == 'rmsnorm' else 'LayerNorm'})"] if norm else []
        out += ["The logits: every word scored", "Next-token probabilities"]
        out += ["The cross-entropy loss"] * ("loss" in problem)
    return out


def _norm_headings(problem: dict) -> tuple[list[str], list[str]]:
    """The steps a norm and a residual add: in front of the heads, and after the output."""
    norm = problem.get("norm")
    kind = "RMSNorm" if norm and norm.get("type") == "rmsnorm" else "LayerNorm"
    post = bool(norm) and norm.get("place") == "post"
    front = [f"Normalise each token ({kind})"] if norm and not post else []
    back = [f"The residual sum and its norm (post-norm, {kind})"] if post else \
        ["The residual stream"] if problem.get("residual") else []
    return front, back


def _mla_headings(problem: dict) -> list[str]:
    """mla: the latent and the up-projections, then per head its Q, K, V, the usual steps and the absorption,
    then the cache table, the heads concatenated and W_O."""
    out = ["Step 1: The input", "Step 2: Compress: the latent c_KV and the shared rotated key k_R",
           "Step 3: The up-projections (a block of columns per head)"]
    per_head = ["The head's queries, keys and values from the latent", *STAGE_TITLES[2:],
                "The absorption: the scores straight from the cache"]
    for h in range(1, int(problem["mla"]["heads"]) + 1):
        out += [f"Head {h} · Step {n}: {t}" for n, t in enumerate(per_head, 4)]
    n = 4 + len(per_head)
    return out + [f"Step {k}: {t}" for k, t in enumerate(["The cache per token: MLA against MHA and GQA",
                                                          "Concatenate the heads", "Output projection"], n)]


def _forward_headings(problem: dict) -> list[str]:
    if "mla" in problem:
        return _mla_headings(problem)
    problem = _from_fields(problem)
    if "mlp" in problem or "logits" in problem:  # both read the residual stream
        problem["residual"] = True
    front, back = _norm_headings(problem)
    back = back + _block_headings(problem)
    stage_titles = STAGE_TITLES
    if "softcap" in problem:  # the cap after the scaling, before the mask
        stage_titles = (*stage_titles[:5], "Soft-cap the scores", *stage_titles[5:])
    if "temperature" in problem:  # the temperature after the mask, before the softmax
        k = stage_titles.index("Apply the mask") + 1
        stage_titles = (*stage_titles[:k], "Divide by the temperature", *stage_titles[k:])
    if "qk_norm" in problem:  # QK-norm after the projections, before RoPE and the keys' transpose
        stage_titles = (*stage_titles[:2], "Normalise the queries and keys (QK-norm)", *stage_titles[2:])
    if "rope" in problem:  # RoPE rotates the queries and keys before the keys are transposed
        stage_titles = (*stage_titles[:2 + ("qk_norm" in problem)], ROPE_TITLE, *stage_titles[2 + ("qk_norm" in problem):])
    stage_titles = stage_titles + ((TILED_TITLE,) if "tiling" in problem else ())
    if "linear" in problem:  # linear attention: the features and the parallel form instead of the softmax's steps
        stage_titles = (*stage_titles[:2], *LINEAR_TITLES[:2], STAGE_TITLES[-1], LINEAR_TITLES[2])
    if "differential" in problem:  # the first map's softmax retitled; the second map and the difference after it
        k = stage_titles.index("Softmax on each row")
        stage_titles = (*stage_titles[:k], *DIFFERENTIAL_TITLES, *stage_titles[k + 1:])
    # decode: t adds its step after each head's, and the cost table after the heads
    stage_titles = stage_titles + (("Decode the new token from the KV cache",) if "decode" in problem else ())
    cost = ("The cost of a decoding step",) if "decode" in problem else ()
    cost += ("The state against the KV cache",) if "linear" in problem else ()
    if "Q" in problem:  # queries, keys and values given: no projection stage
        titles = [GIVEN_INPUT_TITLE, *stage_titles[2:], *cost]
        return [f"Step {n}: {t}" for n, t in enumerate(titles, 1)]
    # between the input and the projections: the positions (and token types), the embeddings' norm, the norm
    inputs = [("Add the positions and the token types" if "token_types" in problem else "Add the positions")] * \
        ("positions" in problem)
    emb = problem.get("embeddings_norm")
    inputs += [f"Normalise the embeddings ({'RMSNorm' if emb['type'] == 'rmsnorm' else 'LayerNorm'})"] if emb else []
    inputs += front
    if "heads" not in problem:
        titles = [stage_titles[0], *inputs, *stage_titles[1:], *cost, *back]
        return [f"Step {n}: {t}" for n, t in enumerate(titles, 1)]
    out = [f"Step {n}: {t}" for n, t in enumerate([stage_titles[0], *inputs], 1)]
    first = len(out) + 1
    n_heads = len(problem["heads"])
    size = n_heads // problem.get("kv_heads", n_heads)  # query heads per K/V group
    for h in range(1, n_heads + 1):
        for n, t in enumerate(stage_titles[1:], first):
            if (h - 1) % size:  # a grouped head reads its group's keys and values, shown with its first head
                if t == "Transpose the keys":
                    continue
                if t == "Project to queries, keys and values":
                    t = f"Project to queries (K/V of group {(h - 1) // size + 1} above)"
            out.append(f"Head {h} · Step {n}: {t}")
    n = len(stage_titles) + first - 1
    out += [f"Step {k}: {t}" for k, t in enumerate(cost, n)]
    n += len(cost)
    return out + [f"Step {k}: {t}" for k, t in enumerate(["Concatenate the heads", "Output projection", *back], n)]


# with linear:, instead of the transpose, scores, scale, mask and softmax (then the weighted sum, then the
# recurrent form; the state's cost after the heads)
LINEAR_TITLES = ("Linear attention: the feature maps", "The parallel form: the masked table and its normalisers",
                 "The recurrent form: one state update per token")
# with differential:, the softmax's step is the first map's, then the second map and the difference (then O)
DIFFERENTIAL_TITLES = ("Softmax on each row: the first map",
                       "The second map: its own queries and keys",
                       "The differential map: the first map minus λ times the second")
# with a tiling: section, after the weighted sum
TILED_TITLE = "The same output in one pass: FlashAttention's online softmax"


def shown_labels(labels: list[str], max_shown: int = 8) -> list[str]:
    """The labels drawn of a list: all, or the first max_shown - 2 and the last."""
    return list(labels) if len(labels) <= max_shown else [*labels[: max_shown - 2], labels[-1]]


MD_MATH = re.compile(r"^\$\$\n(.*?)\n\$\$$", re.MULTILINE | re.DOTALL)
TEX_MATH = re.compile(r"\\symattnfit\{\$\\displaystyle (.*?)\$\}\n\\\]", re.DOTALL)


def math_blocks(text: str) -> list[str]:
    return MD_MATH.findall(text) + TEX_MATH.findall(text)


def block(text: str, prefix: str) -> str:
    """The one display-math block that starts with ``prefix``."""
    found = [b for b in math_blocks(text) if b.startswith(prefix)]
    assert len(found) == 1, f"{len(found)} math blocks start with {prefix!r}"
    return found[0]


STRUT = re.compile(r"\\rule\[-[0-9.]+em\]\{0pt\}\{[0-9.]+em\}")


def blocks_of(text: str, prefix: str) -> list[str]:
    """Every display-math block that starts with ``prefix`` (a wide matrix is split into column blocks)."""
    found = [b for b in math_blocks(text) if b.startswith(prefix)]
    assert found, f"no math block starts with {prefix!r}"
    return found


def parse_array(math: str) -> tuple[list[str] | None, list[tuple[str, list[str]]]]:
    """A labelled matrix (an ``array`` with row labels) as (column labels, [(row label, cells)])."""
    m = re.search(r"\\begin\{array\}\{r\|c+\}(.*?)\\end\{array\}", math, re.DOTALL)
    assert m, f"no labelled array in {math[:200]!r}"
    body = m.group(1)
    header = None
    if "\\hline" in body:
        head, body = body.split("\\hline", 1)
        header = [c.strip() for c in head.strip().removesuffix("\\\\").split("&")][1:]
    rows = []
    for row in re.split(r"\\\\(?:\[6pt\])?", body):
        row = STRUT.sub("", row)  # the strut keeping rows of fractions apart is layout, not a cell
        cells = [c.strip() for c in row.split("&")]
        rows.append((cells[0], cells[1:]))
    return header, rows


def tex_rows(matrix) -> list[list[str]]:
    return [[str(int(v)) for v in row] for row in np.asarray(matrix)]


def text_labels(tokens) -> list[str]:
    return [f"\\text{{{t}}}" for t in tokens]


def bmatrix(rows) -> str:
    return "\\begin{bmatrix} " + " \\\\ ".join(" & ".join(str(v) for v in row) for row in rows) + " \\end{bmatrix}"


def softmax_rows(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    masked = np.where(allowed, scores, -np.inf)
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def causal(n_q: int, n_k: int) -> np.ndarray:
    return np.tril(np.ones((n_q, n_k), dtype=bool))


def four_token_numbers() -> dict[str, np.ndarray]:
    """Every stage of the four-token example, worked out with NumPy from its YAML."""
    p = raw(FOUR)
    X, WQ, WK, WV = (np.array(p[k], dtype=float) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ WQ, X @ WK, X @ WV
    S = Q @ K.T
    S_scaled = S / np.sqrt(WQ.shape[1])
    A = softmax_rows(S_scaled, causal(len(X), len(X)))
    return {"X": X, "Q": Q, "K": K, "V": V, "S": S, "S_scaled": S_scaled, "A": A, "O": A @ V, "tokens": p["tokens"]}


def two_heads_output() -> np.ndarray:
    p = raw(TWO_HEADS)
    X = np.array(p["X"], dtype=float)
    outs = []
    for head in p["heads"]:
        WQ, WK, WV = (np.array(head[k], dtype=float) for k in ("W_Q", "W_K", "W_V"))
        S = (X @ WQ) @ (X @ WK).T / np.sqrt(WQ.shape[1])
        outs.append(softmax_rows(S, causal(len(X), len(X))) @ (X @ WV))
    return np.hstack(outs) @ np.array(p["W_O"], dtype=float)


def four_sig(x: float) -> str:
    return f"{x:.4g}"


# -- fixtures: the expensive things are made once ------------------------------------------


@pytest.fixture(scope="module")
def big():
    """The 64-token derivation (derived once: it is the slow one)."""
    return derivation_of(BIG)


@pytest.fixture(scope="module")
def big_latex(big) -> str:
    return symattn.render_latex(big)


@pytest.fixture(scope="module")
def sheet(tmp_path_factory, symattn_cli):
    """The exercise sheet of the four-token example, asking Q, S_scaled, A, O: as .tex, .md and .pdf."""
    folder = tmp_path_factory.mktemp("sheet")
    ask = "Q,S_scaled,A,O"
    out = {}
    for suffix in (".tex", ".md"):
        r = symattn_cli("derive", FOUR, "--exercise", "--ask", ask, "-o", folder / f"sheet{suffix}", catch_exceptions=False)
        assert r.code == 0, r.stderr
        out[suffix] = (folder / f"sheet{suffix}").read_text("utf-8")
    out[".pdf"] = folder / "sheet.pdf"
    return out


def sheet_pdf(sheet) -> Path:
    need_pdflatex()
    pdf = sheet[".pdf"]
    if not pdf.exists():
        r = CLI("derive", FOUR, "--exercise", "--ask", "Q,S_scaled,A,O", "-o", pdf, catch_exceptions=False)
        assert r.code == 0, r.stderr
    assert pdf.read_bytes().startswith(b"%PDF")
    return pdf


# -- 1. every worked example as a PDF ------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_worked_example_pdf_has_title_headings_and_token_labels(symattn_cli, tmp_path, example):
    need_pdflatex()
    need_pdftotext()
    out = tmp_path / "out.pdf"
    r = symattn_cli("derive", example, "-o", out, catch_exceptions=False)
    assert r.code == 0, r.stderr
    assert out.read_bytes().startswith(b"%PDF")
    problem = raw(example)
    lines = pdf_lines(out)
    text = " ".join(lines)

    assert norm(problem["title"]) in text
    # every stage heading, in order, and no other
    assert headings_in(lines) == expected_headings(problem)

    # the score table S carries the key tokens as column labels and the query tokens as row labels
    query_tokens = problem["tokens"]
    key_tokens = problem.get("context_tokens", query_tokens)
    # (linear attention's table of φ(q_i)·φ(k_j) is its parallel form's)
    scores = section(lines, "The parallel form" if "linear" in problem else "Score every query against every key")
    ellipses = {"·", "···", "…", "...", ".."}
    header = shown_labels(key_tokens)
    rows_of_words = [[w for w in line.split() if w not in ellipses] for line in scores]
    assert any(
        words[k : k + len(header)] == header for words in rows_of_words for k in range(len(words))
    ), f"no line of the score table lists {header}:\n" + "\n".join(scores)
    words = {w for line in rows_of_words for w in line}
    for token in shown_labels(query_tokens):
        assert token in words, f"row label {token!r} missing from the score table"
    assert query_tokens[0] in words and query_tokens[-1] in words
    if len(key_tokens) > 8:
        assert key_tokens[29] not in words, "an elided middle token is drawn in the score table"


# -- 2. the 64-token example: fits the page, elided -----------------------------------------


def test_large_example_has_no_badly_overfull_boxes(tmp_path, big_latex):
    pdflatex = need_pdflatex()
    (tmp_path / "big.tex").write_text(big_latex, encoding="utf-8")
    done = subprocess.run(
        [pdflatex, *PDFLATEX_FLAGS, "big.tex"], cwd=tmp_path, capture_output=True, stdin=subprocess.DEVNULL, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout.decode("utf-8", "replace")[-2000:]
    assert (tmp_path / "big.pdf").read_bytes().startswith(b"%PDF")
    log = (tmp_path / "big.log").read_text("latin-1")
    assert "Output written on big.pdf" in log
    widths = [float(w) for w in re.findall(r"Overfull \\hbox \(([0-9.]+)pt too wide\)", log)]
    too_wide = [w for w in widths if w > 10]
    assert not too_wide, f"overfull boxes wider than 10pt: {too_wide}"


def test_large_example_score_table_is_elided(big_latex):
    tokens = raw(BIG)["tokens"]
    assert len(tokens) == 64
    S = block(big_latex, "S = Q\\,K^{\\top} = ")
    assert "\\cdots" in S and "\\vdots" in S and "\\ddots" in S
    header, rows = parse_array(S)
    assert header == [*text_labels(tokens[:6]), "\\cdots", f"\\text{{{tokens[-1]}}}"]
    assert [label for label, _ in rows] == [*text_labels(tokens[:6]), "\\vdots", f"\\text{{{tokens[-1]}}}"]
    assert all(len(cells) == 8 for _, cells in rows)
    vdots_row = rows[6][1]
    assert vdots_row == ["\\vdots"] * 6 + ["\\ddots", "\\vdots"]
    middle = tokens[29]  # the 30th token
    assert middle not in tokens[:6] + tokens[-1:]
    assert f"\\text{{{middle}}}" not in S


def test_large_example_max_shown_70_shows_every_token(symattn_cli, tmp_path):
    tokens = raw(BIG)["tokens"]
    out = tmp_path / "all.md"
    r = symattn_cli("derive", BIG, "--max-shown", "70", "--no-check", "-o", out, catch_exceptions=False)
    assert r.code == 0, r.stderr
    # 64 columns are too wide for one display: column blocks, together every token
    parts = blocks_of(out.read_text("utf-8"), "S = Q\\,K^{\\top} = ")
    assert len(parts) > 1
    header, cells = [], [[] for _ in tokens]
    for S in parts:
        head, rows = parse_array(S)
        header += head
        assert [label for label, _ in rows] == text_labels(tokens)
        for row, (_, part) in zip(cells, rows):
            row += part
        assert "\\cdots" not in S and "\\vdots" not in S and "\\ddots" not in S
    assert header == text_labels(tokens)
    assert all(len(row) == 64 for row in cells)


# -- 3. shading of the weights -------------------------------------------------------------


def test_weights_are_shaded_by_size_in_latex():
    numbers = four_token_numbers()
    A, tokens = numbers["A"], numbers["tokens"]
    allowed = causal(4, 4)
    latex = symattn.render_latex(derivation_of(FOUR))
    header, rows = parse_array(block(latex, "A \\approx "))
    assert header == text_labels(tokens)
    assert [label for label, _ in rows] == text_labels(tokens)
    from symattn.render.shades import DARKEST, MASKED_TEXT

    shaded = masked = 0
    for i, (_, cells) in enumerate(rows):
        assert len(cells) == 4
        for j, cell in enumerate(cells):
            if not allowed[i, j]:
                assert cell == f"\\color[gray]{{{MASKED_TEXT:.2f}}}0", cell
                masked += 1
                continue
            m = re.fullmatch(r"\\cellcolor\[gray\]\{([0-9.]+)\}(.+)", cell)
            assert m, f"cell ({i}, {j}) is not shaded: {cell!r}"
            level, value = m.group(1), m.group(2)
            assert re.fullmatch(r"[01]\.[0-9]{2}", level), level  # two decimals
            assert abs(float(level) - (1 - (1 - DARKEST) * A[i, j])) <= 0.005 + 1e-9, (i, j, level, A[i, j])
            assert float(value) == pytest.approx(A[i, j], rel=1e-3)
            shaded += 1
    assert (shaded, masked) == (10, 6)
    # the weight 1 of the first row is the darkest grey
    assert rows[0][1][0] == f"\\cellcolor[gray]{{{DARKEST:.2f}}}1"


def test_markdown_has_no_shading():
    markdown = symattn.render_markdown(derivation_of(FOUR))
    assert "\\cellcolor" not in markdown
    assert "\\color[gray]" not in markdown
    _, rows = parse_array(block(markdown, "A \\approx "))
    assert rows[1][1][:2] == [four_sig(v) for v in four_token_numbers()["A"][1][:2]]


# -- 4. labelled matrices ------------------------------------------------------------------


def test_markdown_matrices_carry_token_labels():
    numbers = four_token_numbers()
    tokens = numbers["tokens"]
    assert tokens[0] == "The" and tokens[-1] == "down"
    markdown = symattn.render_markdown(derivation_of(FOUR))
    for prefix, columns in [
        ("S = Q\\,K^{\\top} = ", text_labels(tokens)),
        ("A = \\operatorname{softmax}(\\hat{S}) = ", text_labels(tokens)),
        ("O = A\\,V = ", ["v_{1}", "v_{2}"]),
    ]:
        header, rows = parse_array(block(markdown, prefix))
        assert [label for label, _ in rows] == text_labels(tokens), prefix
        assert header == columns, prefix
    # the scores are right, row by row, under their labels
    _, rows = parse_array(block(markdown, "S = Q\\,K^{\\top} = "))
    assert [cells for _, cells in rows] == tex_rows(numbers["S"])
    # the weight matrices are plain bracketed matrices, without labels
    p = raw(FOUR)
    for name, key in [("W_{Q}", "W_Q"), ("W_{K}", "W_K"), ("W_{V}", "W_V")]:
        math = block(markdown, f"{name} = ")
        assert math == f"{name} = {bmatrix(p[key])}"
        assert "\\text{" not in math and "\\begin{array}" not in math


# -- 5. exercise sheets --------------------------------------------------------------------

ASKED_SECTIONS = {  # the four-token sheet asking Q,S_scaled,A,O: heading -> boxes (rows × columns)
    "Step 2: Project to queries, keys and values": 4 * 4,  # Q: n × d_k
    "Step 5: Scale the scores": 4 * 4,  # S_scaled: n × n
    "Step 7: Softmax on each row": 4 * 4,  # A: n × n
    "Step 8: Weighted sum of the values": 4 * 2,  # O: n × d_v
}


def tex_sections(latex: str) -> dict[str, str]:
    parts = re.split(r"\\section\*\{(.*?)\}\n", latex)
    return dict(zip(parts[1::2], parts[2::2]))


def test_exercise_sheet_has_one_box_per_asked_entry(sheet):
    latex = sheet[".tex"]
    p = raw(FOUR)
    n, d_k, d_v = len(p["X"]), len(p["W_Q"][0]), len(p["W_V"][0])
    assert sum(ASKED_SECTIONS.values()) == n * d_k + n * n + n * n + n * d_v == 56
    assert latex.count("\\boxed") == 56
    sections = tex_sections(latex)
    assert list(sections) == ["Given", *ASKED_SECTIONS]
    for heading, boxes in ASKED_SECTIONS.items():
        assert sections[heading].count("\\boxed") == boxes, heading
    assert sections["Given"].count("\\boxed") == 0
    assert sheet[".md"].count("\\boxed") == 56
    assert "\\title{Exercise: Causal self-attention on four tokens}" in latex
    assert sheet[".md"].startswith("# Exercise: Causal self-attention on four tokens\n")


def test_exercise_sheet_states_the_inputs(sheet):
    p = raw(FOUR)
    for text in (sheet[".tex"], sheet[".md"]):
        _, rows = parse_array(block(text, "X = "))
        assert [label for label, _ in rows] == text_labels(p["tokens"])
        assert [cells for _, cells in rows] == tex_rows(p["X"])
        for name, key in [("W_{Q}", "W_Q"), ("W_{K}", "W_K"), ("W_{V}", "W_V")]:
            # the small weight matrices share one display
            assert f"{name} = {bmatrix(p[key])}" in block(text, "W_{Q} = ")


def test_exercise_sheet_gives_away_no_solution(sheet):
    numbers = four_token_numbers()
    for text in (sheet[".tex"], sheet[".md"]):
        # no exact weights, no normalisers, no decimals
        for leak in ("e^{-1}", "e^{-2}", "e^{-3}", "e^{-4}", "Z_{", "\\dfrac", "\\approx", "\\cellcolor[gray]", "\\infty"):
            assert leak not in text, leak
        for name in ("A", "O"):
            for v in numbers[name].ravel():
                if v not in (0, 1, 2):
                    assert four_sig(v) not in text, (name, v)
        # nor the integer rows of Q and S_scaled
        labels = text_labels(numbers["tokens"])
        for name in ("Q", "S_scaled"):
            for label, row in zip(labels, tex_rows(numbers[name])):
                pattern = re.escape(f"{label} & {' & '.join(row)}") + r" (?:\\\\|\\end)"
                assert not re.search(pattern, text), (name, label)


def test_exercise_sheet_pdf(sheet):
    lines = pdf_lines(sheet_pdf(sheet))
    text = " ".join(lines)
    numbers = four_token_numbers()
    assert "Exercise: Causal self-attention on four tokens" in text
    assert headings_in(lines) == list(ASKED_SECTIONS)
    assert "Given" in lines
    for given in ("Input tokens (X)", "Query weights", "Key weights", "Value weights"):
        assert given in text, given
    for name in ("A", "O"):
        for v in numbers[name].ravel():
            if v not in (0, 1, 2):
                assert four_sig(v) not in text, (name, v)
    assert "Cross-check" not in text


@pytest.mark.parametrize(
    "example, ask",
    [(FOUR, "Q,S_scaled,A,O"), (FOUR, None), (TWO_HEADS, None), (TWO_HEADS, "S,A"), (QKV_GIVEN, "A,O")],
    ids=["four-asked", "four-all", "two-heads-all", "two-heads-S-A", "qkv-A-O"],
)
def test_exercise_sections_pair_with_the_solution(symattn_cli, tmp_path, example, ask):
    extra = ["--ask", ask] if ask else []
    r = symattn_cli("derive", example, "--exercise", *extra, "-o", tmp_path / "sheet.tex", catch_exceptions=False)
    assert r.code == 0, r.stderr
    r = symattn_cli("derive", example, "--no-check", "-o", tmp_path / "solution.tex", catch_exceptions=False)
    assert r.code == 0, r.stderr

    def plain(heading: str) -> str:
        return heading.replace("\\ensuremath{\\cdot}", "·")

    sheet = [plain(h) for h in tex_sections((tmp_path / "sheet.tex").read_text("utf-8")) if h != "Given"]
    solution = [plain(h) for h in tex_sections((tmp_path / "solution.tex").read_text("utf-8"))]
    expected = expected_headings(raw(example))
    assert solution == expected
    asked = set(ask.split(",")) if ask else None
    want = [
        h for h in expected
        if not h.endswith(("Step 1: The input", GIVEN_INPUT_TITLE))  # the inputs are given, not asked
        and (asked is None or STAGE_KINDS[h.split(": ", 1)[1]] & asked)
    ]
    assert sheet == want


def _named(stderr: str) -> list[str]:
    valid = re.search(r"choose from (.*)", stderr, re.S)
    assert valid, stderr
    return [v.strip() for v in valid.group(1).replace("\n", " ").split(",")]


def test_ask_with_an_unknown_id_names_the_valid_ids(symattn_cli):
    r = symattn_cli("derive", FOUR, "--exercise", "--ask", "Q,bogus", catch_exceptions=False)
    assert r.code == 2
    assert "bogus" in r.stderr
    # the problem's own stages, in the formula's order: one head, so no concat or W_O
    assert _named(r.stderr) == ["X", "W_Q", "W_K", "W_V", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked",
                                "A", "O"]
    assert r.stdout == ""


def test_ask_names_a_stage_the_problem_does_not_have(symattn_cli):
    """concat is a stage of a problem with heads, not of one head: asked of one head it would have
    been left out of the sheet without a word."""
    r = symattn_cli("derive", FOUR, "--exercise", "--ask", "A,concat", catch_exceptions=False)
    assert r.code == 2
    assert "concat is not a stage of this problem" in r.stderr
    assert "concat" not in _named(r.stderr)
    assert r.stdout == ""
    heads = symattn_cli("derive", TWO_HEADS, "--exercise", "--ask", "A,bogus", catch_exceptions=False)
    assert heads.code == 2
    assert {"concat", "W_O", "A", "O"} <= set(_named(heads.stderr))
    gradient = symattn_cli("derive", FOUR, "--exercise", "--ask", "dQ", catch_exceptions=False)
    assert gradient.code == 2 and "add --backward" in gradient.stderr
    asked = symattn_cli("derive", FOUR, "--exercise", "--ask", "dQ", "--backward", "-f", "markdown",
                        catch_exceptions=False)
    assert asked.code == 0, asked.stderr


def test_ask_without_exercise_is_a_usage_error(symattn_cli):
    r = symattn_cli("derive", FOUR, "--ask", "A", catch_exceptions=False)
    assert r.code == 2
    assert "--ask" in r.stderr and "--exercise" in r.stderr
    assert r.stdout == ""


def test_exercise_as_json_is_a_usage_error(symattn_cli):
    r = symattn_cli("derive", FOUR, "--exercise", "--format", "json", catch_exceptions=False)
    assert r.code == 2
    assert "exercise" in r.stderr
    assert r.stdout == ""


# -- 6. step selection ---------------------------------------------------------------------


def md_sections(markdown: str) -> list[tuple[str, str]]:
    parts = re.split(r"^## (.*)$", markdown, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2]))


def test_from_S_to_A_shows_only_those_steps_with_their_inputs_given(symattn_cli):
    numbers = four_token_numbers()
    tokens = numbers["tokens"]
    r = symattn_cli("derive", FOUR, "--from", "S", "--to", "A", "--format", "markdown", catch_exceptions=False)
    assert r.code == 0, r.stderr
    markdown = r.stdout
    sections = md_sections(markdown)
    assert [h for h, _ in sections] == [
        "Given",
        "Step 4: Score every query against every key",
        "Step 5: Scale the scores",
        "Step 6: Apply the mask",
        "Step 7: Softmax on each row",
        "Cross-check",
    ]
    steps = re.findall(r"^\*\*(.*?)\.\*\*", markdown, flags=re.MULTILINE)
    assert steps == ["Scores", "Scale the scores", "The mask", "Add the mask", "Softmax on each row"]
    assert "**Query projection.**" not in markdown
    assert "Weighted sum of the values" not in markdown
    assert "O = A\\,V" not in markdown
    # the inputs of S, Q and Kᵀ, are stated under Given, with their values
    given = sections[0][1]
    header, rows = parse_array(block(given, "Q = "))
    assert [label for label, _ in rows] == text_labels(tokens)
    assert [cells for _, cells in rows] == tex_rows(numbers["Q"])
    header, rows = parse_array(block(given, "K^{\\top} = "))
    assert header == text_labels(tokens)
    assert [cells for _, cells in rows] == tex_rows(numbers["K"].T)
    assert "($Q$)" in given and "($K^{\\top}$)" in given  # named by their symbols, not their ids
    assert "X = " not in given and "W_{Q} = " not in given


def test_from_after_to_is_a_usage_error(symattn_cli):
    r = symattn_cli("derive", FOUR, "--from", "A", "--to", "S", catch_exceptions=False)
    assert r.code == 2
    assert "--from A" in r.stderr
    assert r.stdout == ""


def test_two_heads_to_O_ends_with_the_output_projection(symattn_cli):
    r = symattn_cli("derive", TWO_HEADS, "--to", "O", "--format", "markdown", catch_exceptions=False)
    assert r.code == 0, r.stderr
    markdown = r.stdout
    headings = [h for h, _ in md_sections(markdown) if h != "Cross-check"]
    assert headings == expected_headings(raw(TWO_HEADS))
    assert headings[-1] == "Step 10: Output projection"
    steps = re.findall(r"^\*\*(.*?)\.\*\*", markdown, flags=re.MULTILINE)
    assert steps[-1] == "Output projection"
    last = dict(md_sections(markdown))["Step 10: Output projection"]
    assert "O = \\operatorname{concat}\\,W_O = " in last
    _, rows = parse_array(block(last, "O \\approx "))
    expected = two_heads_output()
    for (_, cells), row in zip(rows, expected, strict=True):
        assert [float(c) for c in cells] == pytest.approx(list(row), rel=1e-3)


def test_two_heads_from_S_to_A_shows_both_heads(symattn_cli):
    r = symattn_cli("derive", TWO_HEADS, "--from", "S", "--to", "A", "--format", "markdown", catch_exceptions=False)
    assert r.code == 0, r.stderr
    headings = [h for h, _ in md_sections(r.stdout)]
    middle = STAGE_TITLES[3:7]
    assert headings == [
        "Given",
        *[f"Head 1 · Step {n}: {t}" for n, t in enumerate(middle, 4)],
        *[f"Head 2 · Step {n}: {t}" for n, t in enumerate(middle, 4)],
        "Cross-check",
    ]
    steps = re.findall(r"^\*\*(.*?)\.\*\*", r.stdout, flags=re.MULTILINE)
    assert steps == ["Scores", "Scale the scores", "The mask", "Add the mask", "Softmax on each row"] * 2


def test_two_heads_from_S_states_every_heads_inputs(symattn_cli):
    r = symattn_cli("derive", TWO_HEADS, "--from", "S", "--to", "A", "--format", "markdown", catch_exceptions=False)
    assert r.code == 0, r.stderr
    given = dict(md_sections(r.stdout))["Given"]
    for h in (1, 2):
        assert f"($Q^{{({h})}}$)" in given, h  # named by their symbols with the head's number, not by ids
        assert f"($K^{{({h})\\top}}$)" in given, h


# -- 7. --plot -----------------------------------------------------------------------------


def test_plot_png_of_one_and_two_heads(symattn_cli, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    sizes = {}
    for example in (FOUR, TWO_HEADS):
        png = tmp_path / f"{example.stem}.png"
        r = symattn_cli("derive", example, "--plot", png, "-o", tmp_path / f"{example.stem}.md", catch_exceptions=False)
        assert r.code == 0, r.stderr
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert (tmp_path / f"{example.stem}.md").read_text("utf-8").startswith("# ")
        image = matplotlib.image.imread(png)
        height, width = image.shape[:2]
        assert 200 <= height <= 3000 and 200 <= width <= 6000, image.shape
        assert float(image[..., :3].std()) > 0.05, "the heat map is blank"
        assert len(np.unique(image[..., :3].reshape(-1, 3), axis=0)) > 20
        sizes[example.stem] = (height, width)
    # two heads: two panels side by side
    assert sizes["two_heads"][1] > sizes["two_heads"][0]
    assert sizes["two_heads"][1] > sizes["causal_4_tokens"][1]


@pytest.mark.parametrize("suffix, magic", [(".svg", b"<svg"), (".pdf", b"%PDF")])
def test_plot_format_follows_the_suffix(symattn_cli, tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"weights{suffix}"
    r = symattn_cli("derive", FOUR, "--plot", out, "-o", tmp_path / "solution.md", catch_exceptions=False)
    assert r.code == 0, r.stderr
    data = out.read_bytes()
    if suffix == ".svg":
        assert data.lstrip().startswith(b"<?xml") and magic in data[:2000]
        assert b"Attention weights A" in data
    else:
        assert data.startswith(magic)


def test_plot_with_an_unknown_suffix_is_one_error_line(symattn_cli, tmp_path):
    pytest.importorskip("matplotlib")
    r = symattn_cli("derive", FOUR, "--plot", tmp_path / "weights.gif", "-o", tmp_path / "solution.md", catch_exceptions=False)
    assert r.code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ") and ".gif" in lines[0] and ".png" in lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "weights.gif").exists()


def test_plot_is_deterministic(symattn_cli, tmp_path):
    pytest.importorskip("matplotlib")
    for name in ("a.png", "b.png"):
        r = symattn_cli("derive", FOUR, "--no-check", "--plot", tmp_path / name, "-o", tmp_path / "solution.md", catch_exceptions=False)
        assert r.code == 0, r.stderr
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_plot_without_matplotlib_says_how_to_install_it(symattn_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    r = symattn_cli("derive", FOUR, "--plot", tmp_path / "weights.png", "-o", tmp_path / "solution.md", catch_exceptions=False)
    assert r.code == 1
    assert "pip install 'symattn[plot]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "weights.png").exists()


# -- 8. the PDF compile path ---------------------------------------------------------------

BROKEN = "\\documentclass{article}\n\\begin{document}\nHello \\undefinedcommandxyz\n\\end{document}\n"


def which_without(*missing):
    real = shutil.which

    def which(name, *args, **kwargs):
        return None if name in missing else real(name, *args, **kwargs)

    return which


@pytest.fixture
def commands(monkeypatch):
    """Records the commands symattn.render.pdf runs (and still runs them)."""
    seen: list[list[str]] = []
    real = subprocess.run

    def spy(command, *args, **kwargs):
        seen.append([str(c) for c in command])
        return real(command, *args, **kwargs)

    monkeypatch.setattr(symattn.render.pdf.subprocess, "run", spy)
    return seen


def test_pdf_without_latexmk_is_made_with_pdflatex(symattn_cli, tmp_path, monkeypatch, commands):
    pdflatex = need_pdflatex()
    monkeypatch.setattr(symattn.render.pdf.shutil, "which", which_without("latexmk"))
    out = tmp_path / "solution.pdf"
    r = symattn_cli("derive", FOUR, "-o", out, catch_exceptions=False)
    assert r.code == 0, r.stderr
    ran = list(commands)
    assert len(ran) == 1 and ran[0][0] == pdflatex, ran
    assert not any("latexmk" in part for part in ran[0])
    assert out.read_bytes().startswith(b"%PDF")
    if PDFTOTEXT is not None:
        assert "Causal self-attention on four tokens" in " ".join(pdf_lines(out))


@pytest.mark.parametrize("path", ["latexmk", "pdflatex"])
def test_broken_latex_error_quotes_the_log(monkeypatch, commands, path):
    pdflatex = need_pdflatex()
    if path == "latexmk":
        if LATEXMK is None:
            pytest.skip("latexmk is not installed")
    else:
        monkeypatch.setattr(symattn.render.pdf.shutil, "which", which_without("latexmk"))
    with pytest.raises(symattn.SymattnError) as info:
        symattn.render.pdf.latex_to_pdf(BROKEN)
    assert commands and commands[0][0] == (LATEXMK if path == "latexmk" else pdflatex)
    message = str(info.value)
    assert "! Undefined control sequence" in message
    assert "\\undefinedcommandxyz" in message
    assert "\n" not in message


def test_no_pdflatex_names_the_package_to_install(symattn_cli, tmp_path, monkeypatch, commands):
    monkeypatch.setattr(symattn.render.pdf.shutil, "which", which_without("latexmk", "pdflatex"))
    with pytest.raises(symattn.SymattnError, match="texlive-latex-base"):
        symattn.render.pdf.latex_to_pdf(BROKEN)
    r = symattn_cli("derive", FOUR, "-o", tmp_path / "solution.pdf", catch_exceptions=False)
    assert r.code == 1
    assert "texlive-latex-base" in r.stderr
    assert not (tmp_path / "solution.pdf").exists()
    assert commands == []


# -- 9. Jupyter ----------------------------------------------------------------------------


def exact_four_token_weights() -> sympy.Matrix:
    """A of the four-token example with SymPy, straight from the YAML."""
    p = raw(FOUR)
    X, WQ, WK = (sympy.Matrix(p[k]) for k in ("X", "W_Q", "W_K"))
    S = (X * WQ) * (X * WK).T / sympy.sqrt(WQ.shape[1])
    n = S.rows
    A = sympy.zeros(n, n)
    for i in range(n):
        total = sum(sympy.exp(S[i, k]) for k in range(i + 1))
        for j in range(i + 1):
            A[i, j] = sympy.exp(S[i, j]) / total
    return A


def test_derivation_repr_markdown_is_the_markdown_rendering():
    d = derivation_of(FOUR)
    assert d._repr_markdown_() == symattn.render_markdown(d)


def test_step_repr_latex_writes_the_solutions_forms():
    """A step in a notebook is written as the worked solution writes it: each weight e^{…}/Z_i
    (never SymPy's nests such as 1/((e^{-2} + 1) e^{2})), with the rows' m_i and Z_i beneath."""
    from symattn.render.matrices import form_tex
    from symattn.render.entries import entry_forms

    d = derivation_of(FOUR)
    step = d.step("A")
    latex = step._repr_latex_()
    assert latex.startswith("$$") and latex.rstrip().endswith("$$")
    assert "Z_{2}" in latex and "\\dfrac{e^{-2}}{Z_{2}}" in latex
    assert "\\frac{1}{\\left(" not in latex and "1/(" not in latex
    for i in (2, 3, 4):  # the normalisers the fractions refer to (aligned on their = signs)
        assert re.search(re.escape(f"Z_{{{i}}}") + r" &?= \\sum_k", latex), i
    header, rows = parse_array(latex)
    tokens = raw(FOUR)["tokens"]
    assert header == text_labels(tokens)
    assert [label for label, _ in rows[:4]] == text_labels(tokens)
    form = entry_forms(d, step)
    expected = exact_four_token_weights()
    for i, (_, cells) in enumerate(rows[:4]):
        for j, cell in enumerate(cells[:4]):
            f = form(i, j)
            assert cell == form_tex(f), (i, j, cell)
            value = f.value
            if f.over:
                q = lambda x: sympy.Rational(int(x.numerator), int(x.denominator))  # noqa: E731
                top = sum(q(c) * sympy.exp(q(x)) for c, x in f.over[0].numerator)  # exact (c, x) pairs
                value = top / step.softmax[i].normaliser
            assert abs(sympy.N(value - expected[i, j], 30)) < sympy.Float("1e-25"), (i, j)


def test_step_repr_is_one_line_and_str_shows_the_forms():
    d = derivation_of(FOUR)
    step = d.step("A")
    assert "\n" not in repr(step) and repr(step).startswith("<symattn.Step A: Softmax on each row")
    text = str(step)
    assert "exp(-2)/Z_2" in text and "Z_2 = 1 + exp(-2)" in text and "1/(" not in text


def test_step_repr_markdown_has_title():
    d = derivation_of(FOUR)
    for id, title in [("A", "Softmax on each row"), ("S", "Scores"), ("Q", "Query projection")]:
        step = d.step(id)
        markdown = step._repr_markdown_()
        assert title in markdown
        assert markdown.startswith(f"**{title}**")
        assert step._repr_latex_() in markdown


# -- 10. text output elides big matrices ---------------------------------------------------


def test_large_text_output_is_elided(big):
    text = symattn.render_text(big)
    tokens = raw(BIG)["tokens"]
    assert "…" in text and "⋮" in text
    # the S grid: first six key tokens, …, the last
    lines = text.splitlines()
    s = lines.index(next(line for line in lines if line.strip().startswith("Scores (S)")))
    header = lines[s + 2].split()
    assert header == [*tokens[:6], "…", tokens[-1]]
    assert tokens[29] not in header


def test_large_text_output_has_no_very_long_lines(big):
    text = symattn.render_text(big)
    longest = max(len(line) for line in text.splitlines())
    assert longest <= 400, f"a line of {longest} characters"
