"""Matrices as LaTeX math: labelled with tokens, elided when large, optionally shaded.

A matrix whose rows are tokens is drawn as a small table: the row labels on
the left, the column labels (key tokens, or dimension names) on top, so a
reader finds "how much *sat* attends to *cat*" at row *sat*, column *cat*.
Above ``max_shown`` rows or columns only the first ones and the last one are
drawn, with ⋮, ⋯ and ⋱ in between; entries that are not drawn are never
computed.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .latex_tokens import display_fractions, has_fraction
from .measure import needs_strut, strut, width

Index = int | None  # None marks the elided band
MAX_SHOWN = 8  # rows or columns drawn before a matrix is elided


def shown(n: int, max_shown: int) -> list[Index]:
    """The indices drawn of ``n``: all, or the first ``max_shown - 2``, a gap and the last.

    >>> shown(4, 8)
    [0, 1, 2, 3]
    >>> shown(64, 8)
    [0, 1, 2, 3, 4, 5, None, 63]
    """
    if n <= max_shown:
        return list(range(n))
    head = max(1, max_shown - 2)
    return list(range(head)) + [None, n - 1]


def grid(
    n_rows: int,
    n_cols: int,
    cell: Callable[[int, int], str],
    *,
    max_shown: int,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    shade: Callable[[int, int], str] | None = None,
) -> str:
    """LaTeX of a matrix; with ``row_labels`` a labelled table, else a bracketed matrix.

    ``cell(i, j)`` gives an entry's LaTeX; ``shade(i, j)`` a prefix such as
    ``\\cellcolor[gray]{0.8}`` (LaTeX with colortbl only).
    """
    return grid_blocks(n_rows, n_cols, cell, max_shown=max_shown, row_labels=row_labels,
                       col_labels=col_labels, shade=shade)[0][1]


def grid_blocks(
    n_rows: int,
    n_cols: int,
    cell: Callable[[int, int], str],
    *,
    max_shown: int,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    shade: Callable[[int, int], str] | None = None,
    budget: float | None = None,
) -> list[tuple[tuple[int, int], str]]:
    """The matrix as column blocks no wider than ``budget`` points (estimated), each as
    ``((first column, last column), LaTeX)``, 0-based; one block when it fits or ``budget`` is None.

    A matrix with a fraction writes every fraction as ``\\dfrac`` (one size throughout)
    and gives each row a strut as tall and deep as its tallest entry plus a gap, so rows
    of fractions never touch, in pdflatex, MathJax and KaTeX alike.
    """
    rows = shown(n_rows, max_shown)
    cols = shown(n_cols, max_shown)

    def entry(i: Index, j: Index) -> str:
        if i is None and j is None:
            return "\\ddots"
        if i is None:
            return "\\vdots"
        if j is None:
            return "\\cdots"
        return cell(i, j)

    body = {(i, j): entry(i, j) for i in rows for j in cols}
    if any(has_fraction(c) for c in body.values()):
        body = {key: display_fractions(c) for key, c in body.items()}
    tall = any(needs_strut(c) for c in body.values())
    row_strut = strut(list(body.values())) if tall else ""
    if shade is not None:
        body = {(i, j): (shade(i, j) + c if i is not None and j is not None else c) for (i, j), c in body.items()}
    blocks = [cols]
    if budget is not None and len(cols) > 1:
        blocks = _pack(cols, rows, body, row_labels, col_labels, budget)

    def draw(block: list[Index]) -> str:
        body_rows = [[body[i, j] for j in block] for i in rows]
        if row_labels is None:
            text = " \\\\ ".join(row_strut + " & ".join(row) for row in body_rows)
            return f"\\begin{{bmatrix}} {text} \\end{{bmatrix}}"
        lines = [row_strut + ("\\vdots" if i is None else row_labels[i]) + " & " + " & ".join(row)
                 for i, row in zip(rows, body_rows)]
        text = " \\\\ ".join(lines)
        if col_labels is not None:
            header = " & ".join("\\cdots" if j is None else col_labels[j] for j in block)
            text = f" & {header} \\\\ \\hline {text}"
        return f"\\begin{{array}}{{r|{'c' * len(block)}}} {text} \\end{{array}}"

    out = []
    for block in blocks:
        real = [j for j in block if j is not None]
        out.append(((real[0], real[-1]), draw(block)))
    return out


def _pack(cols, rows, body, row_labels, col_labels, budget) -> list[list[Index]]:
    """Shown columns packed greedily into blocks of estimated width at most ``budget``."""
    label_w = 0.0 if row_labels is None else max(width(row_labels[i]) for i in rows if i is not None) + 10.4
    col_w = {
        j: max([width(body[i, j]) for i in rows] + ([width(col_labels[j])] if col_labels and j is not None else []))
        + 10.0
        for j in cols
    }
    # an elided band stays with the column after it (⋯ v_16)
    units: list[list[Index]] = []
    for j in cols:
        if units and units[-1][-1] is None:
            units[-1].append(j)
        else:
            units.append([j])
    widths = [sum(col_w[j] for j in unit) for unit in units]
    # the fewest blocks, greedily ...
    count, used = 0, budget
    for w in widths:
        if count and used + w <= budget:
            used += w
        else:
            count, used = count + 1, label_w + w
    # ... then balanced: the cut into that many blocks whose widest block is narrowest
    cuts = _balanced_cuts(widths, count)
    return [[j for unit in units[a:b] for j in unit] for a, b in zip([0, *cuts], [*cuts, len(units)])]


def _balanced_cuts(widths: list[float], parts: int) -> list[int]:
    """Where to cut ``widths`` into ``parts`` consecutive runs so the largest run sum is smallest."""
    n = len(widths)
    prefix = [0.0]
    for w in widths:
        prefix.append(prefix[-1] + w)
    # best[k][i]: (largest run, cuts) for the first i widths in k runs
    best: list[list[tuple[float, list[int]]]] = [[(0.0, [])] + [(float("inf"), [])] * n]
    for k in range(1, parts + 1):
        row = [(float("inf"), [])] * (n + 1)
        for i in range(1, n + 1):
            for j in range(k - 1, i):
                prev, cuts = best[k - 1][j]
                worst = max(prev, prefix[i] - prefix[j])
                if worst < row[i][0]:
                    row[i] = (worst, cuts + ([j] if j else []))
        best.append(row)
    return best[parts][n][1]
