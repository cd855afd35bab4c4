"""Problem files and the peer pipelines for benchmarks/bench_derive.py.

Not a benchmark by itself. It writes the random benchmark problems (YAML of
3-decimal entries, and the same matrices as .npy files) and holds the three
peers symattn is measured against:

* ``naive``: the newcomer's plain ``sympy.Matrix`` pipeline (exact, slow);
* ``numpy``: NumPy float64, the same stages with a max-subtracted softmax;
* ``bare``: a bare script: PyYAML's libyaml loader keeping numbers as text,
  ``fractions.Fraction`` of that text, python-flint ``fmpq_mat`` products and
  a 30-digit ``arb`` softmax and output.

Each peer is a plain function of the problem file's path that returns the
seconds it took (timed from reading the file to its last result, with its
imports already done). Run as a script it times one peer in a fresh process
and prints one line of JSON, which is how bench_derive.py runs the naive
pipeline under a time cap:

    python benchmarks/_problems.py naive PROBLEM.yaml
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

# -- problem files -------------------------------------------------------------


def random_matrices(n: int, d_model: int, d_k: int, seed: int = 0, dyadic: bool = False) -> dict:
    """X ~ N(0, 1) (n × d_model) and W_Q, W_K, W_V ~ N(0, 0.1) (d_model × d_k), rounded to 3
    decimals, or with ``dyadic`` to multiples of 1/1024 (numbers float64 holds exactly)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {"X": rng.normal(0.0, 1.0, size=(n, d_model))}
    for name in ("W_Q", "W_K", "W_V"):
        out[name] = rng.normal(0.0, 0.1, size=(d_model, d_k))
    # The YAML holds these rounded (to 3 decimals, or to multiples of 1/1024); the .npy files hold
    # the same rounded numbers (+ 0.0 turns a -0.0 into 0.0, so no entry is written as -0.000).
    if dyadic:
        return {name: np.round(m * 1024) / 1024 + 0.0 for name, m in out.items()}
    return {name: np.round(m, 3) + 0.0 for name, m in out.items()}


def _decimal(x: float, dyadic: bool = False) -> str:
    """An entry as the problem file writes it: 3 decimals, or a multiple of 1/1024 written out
    exactly (at most 10 decimals: the very number float64 holds)."""
    if not dyadic:
        return f"{x:.3f}"
    from decimal import Decimal

    return format(Decimal(x), "f")


def _yaml_matrix(m, dyadic: bool = False) -> str:
    rows = ("[" + ", ".join(_decimal(x, dyadic) for x in row) + "]" for row in m.tolist())
    return "[" + ", ".join(rows) + "]"


def write_problem(folder: Path, n: int, d_model: int, d_k: int, seed: int = 0) -> tuple[Path, Path]:
    """Write ``problem.yaml`` (decimals inline) and ``problem_npy.yaml`` (``{file: x.npy}`` etc.) in ``folder``.

    Returns the two paths. The .npy files hold the same numbers as float64.
    """
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    mats = random_matrices(n, d_model, d_k, seed)
    title = f"bench {n} {d_model} {d_k}"
    lines = [f"title: {title}", "mask: causal"]
    lines += [f"{name}: {_yaml_matrix(m)}" for name, m in mats.items()]
    yaml_path = folder / "problem.yaml"
    yaml_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    files = {"X": "x.npy", "W_Q": "wq.npy", "W_K": "wk.npy", "W_V": "wv.npy"}
    for name, file in files.items():
        np.save(folder / file, mats[name].astype(np.float64))
    npy_lines = [f"title: {title} (npy)", "mask: causal"] + [f"{name}: {{file: {file}}}" for name, file in files.items()]
    npy_path = folder / "problem_npy.yaml"
    npy_path.write_text("\n".join(npy_lines) + "\n", encoding="utf-8")
    return yaml_path, npy_path


LAYOUTS = ("flow_rows", "block", "one_line", "crlf", "npy", "csv")


def write_layouts(folder: Path, n: int, d_model: int, d_k: int, seed: int = 0) -> dict:
    """The same problem in every layout of issue #20; returns {layout: path of the problem file}.

    flow_rows: ``X:`` then ``- [..]`` per row; block: ``yaml.safe_dump``'s default block style;
    one_line: ``X: [[..], ..]``; crlf: flow rows with CRLF line ends; npy / csv: ``{file: ..}``.

    The entries are multiples of 1/1024 (:func:`random_matrices` with ``dyadic``), written out
    exactly: a .npy file's float64 holds such a number exactly, so every layout holds the very
    same exact problem. (A 3-decimal entry such as 0.611 is no float64: its .npy file would hold
    the nearest binary number, a 53-bit fraction, and so a different and harder exact problem.)
    """
    import numpy as np
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    mats = random_matrices(n, d_model, d_k, seed, dyadic=True)
    names = ("X", "W_Q", "W_K", "W_V")
    head = [f"title: bench {n} {d_model} {d_k}", "mask: causal"]
    out = {}

    def put(layout, lines, newline="\n"):
        path = folder / f"{layout}.yaml"
        path.write_bytes((newline.join(lines) + newline).encode("utf-8"))
        out[layout] = path

    texts = {name: [[_decimal(x, True) for x in row] for row in mats[name].tolist()] for name in names}
    flow = list(head)
    for name in names:
        flow.append(f"{name}:")
        flow += ["- [" + ", ".join(row) + "]" for row in texts[name]]
    put("flow_rows", flow)
    doc = {"title": f"bench {n} {d_model} {d_k}", "mask": "causal"}
    doc.update({name: mats[name].tolist() for name in names})
    # safe_dump writes a float as its repr, the shortest text that reads back as the same float64:
    # for these numbers, their exact decimals (checked here, so the layouts cannot drift apart)
    for name in names:
        assert [[repr(x) for x in row] for row in doc[name]] == [[t if "." in t else t + ".0" for t in row]
                                                                  for row in texts[name]], name
    path = folder / "block.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    out["block"] = path
    put("one_line", head + [f"{name}: [" + ", ".join("[" + ", ".join(row) + "]" for row in texts[name]) + "]"
                            for name in names])
    put("crlf", flow, "\r\n")
    for kind in ("npy", "csv"):
        lines = list(head)
        for name in names:
            file = f"{name.lower()}.{kind}"
            if kind == "npy":
                np.save(folder / file, mats[name].astype(np.float64))
            else:
                (folder / file).write_text("".join(",".join(row) + "\n" for row in texts[name]), encoding="utf-8")
            lines.append(f"{name}: {{file: {file}}}")
        put(kind, lines)
    return out


# -- the naive sympy.Matrix pipeline -----------------------------------------------


def naive(path: Path, ready=None) -> float:
    """The newcomer's version: yaml.safe_load, sympy.Rational entries, sympy.Matrix stages, evalf(30), latex.

    ``ready()``, when given, is called once the imports are done, just before the clock starts.
    """
    import sympy
    import yaml

    if ready is not None:
        ready()
    start = time.perf_counter()
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    X, W_Q, W_K, W_V = (
        sympy.Matrix([[sympy.Rational(str(x)) for x in row] for row in data[name]])
        for name in ("X", "W_Q", "W_K", "W_V")
    )
    Q, K, V = X * W_Q, X * W_K, X * W_V
    n, d_k = Q.shape
    S = Q * K.T
    S_scaled = S / sympy.sqrt(d_k)
    M = sympy.Matrix(n, n, lambda i, j: 0 if j <= i else -sympy.oo)
    S_masked = S_scaled + M
    rows = []
    for i in range(n):
        exps = [sympy.exp(S_masked[i, j]) for j in range(n)]
        Z = sum(exps)
        rows.append([e / Z for e in exps])
    A = sympy.Matrix(rows)
    O = A * V
    O_num = O.applyfunc(lambda e: e.evalf(30))
    for m in (X, W_Q, W_K, W_V, Q, K, V, K.T, S, S_scaled, M, S_masked, A, O, O_num):
        sympy.latex(m)
    return time.perf_counter() - start


# -- NumPy float64 ---------------------------------------------------------------


def numpy_peer(path: Path) -> tuple[float, float]:
    """YAML (libyaml) to float64 arrays, then every stage in NumPy. Returns (end to end s, compute-only s)."""
    import numpy as np
    import yaml

    start = time.perf_counter()
    data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)
    X, W_Q, W_K, W_V = (np.array(data[name], dtype=np.float64) for name in ("X", "W_Q", "W_K", "W_V"))
    compute = time.perf_counter()
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ K.T
    S_scaled = S / math.sqrt(Q.shape[1])
    n = S.shape[0]
    M = np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf)
    S_masked = S_scaled + M
    E = np.exp(S_masked - S_masked.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    O = A @ V
    end = time.perf_counter()
    assert np.isfinite(O).all()
    return end - start, end - compute


# -- the bare script: libyaml + Fraction + fmpq_mat + arb ---------------------------


def bare_available() -> str | None:
    """None when the bare script can run, else why not."""
    try:
        import yaml
        from flint import arb, arb_mat, ctx, fmpq, fmpq_mat  # noqa: F401
    except ImportError as exc:
        return f"python-flint's arb is not available ({exc})"
    if not getattr(yaml, "__with_libyaml__", False):
        return "PyYAML was built without libyaml (no yaml.CSafeLoader)"
    return None


def _text_loader():
    """yaml.CSafeLoader with the float resolver removed, so 0.123 stays the string '0.123'."""
    import yaml

    class TextNumbers(yaml.CSafeLoader):
        pass

    TextNumbers.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
        for first, resolvers in yaml.CSafeLoader.yaml_implicit_resolvers.items()
    }
    return TextNumbers


def bare(path: Path) -> float:
    """The bare-script peer: exact products with fmpq_mat, softmax and O with arb at 30 digits."""
    from fractions import Fraction

    import yaml
    from flint import arb, arb_mat, ctx, fmpq, fmpq_mat

    loader = _text_loader()
    start = time.perf_counter()
    data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader)
    for name, value in list(data.items()):  # matrices in .npy / .csv files: the floor reads them too
        if isinstance(value, dict) and "file" in value:
            file = Path(path).parent / value["file"]
            if file.suffix == ".npy":
                import numpy as np

                data[name] = [[repr(x) for x in row] for row in np.load(file).tolist()]
            else:
                data[name] = [line.split(",") for line in file.read_text(encoding="utf-8").splitlines() if line]

    def matrix(rows):
        entries = []
        for row in rows:
            for x in row:
                f = Fraction(str(x))
                entries.append(fmpq(f.numerator, f.denominator))
        return fmpq_mat(len(rows), len(rows[0]), entries)

    X, W_Q, W_K, W_V = (matrix(data[name]) for name in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X * W_Q, X * W_K, X * W_V
    n, d_k = Q.nrows(), Q.ncols()
    root = math.isqrt(d_k)
    assert root * root == d_k, "the bare script scales by a rational 1/√d_k"
    S = Q * K.transpose()
    S_scaled = S * fmpq(1, root)
    saved, ctx.dps = ctx.dps, 30
    weights = []
    for i in range(n):  # causal: row i sees keys 0..i
        row = [S_scaled[i, j] for j in range(i + 1)]
        m = max(row)
        exps = [arb(s - m).exp() for s in row]
        Z = sum(exps[1:], exps[0])
        weights.extend([e / Z for e in exps] + [arb(0)] * (n - i - 1))
    A = arb_mat(n, n, weights)
    O = A * arb_mat(V)
    end = time.perf_counter()
    ctx.dps = saved
    assert O.nrows() == n
    return end - start


PEERS = {"naive": naive, "numpy": numpy_peer, "bare": bare}


def _child(argv: list[str]) -> None:
    name, path = argv

    def ready():  # tells the parent the clock starts now (its time cap counts from here)
        print("START", flush=True)

    try:
        result = naive(Path(path), ready) if name == "naive" else PEERS[name](Path(path))
        print(json.dumps({"ok": True, "result": result}))
    except Exception as exc:  # noqa: BLE001  (the parent records it and carries on)
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))


if __name__ == "__main__":
    _child(sys.argv[1:])
