"""The attention weights as a labelled heat map (matplotlib, an optional extra)."""

from __future__ import annotations

import io
import math

from .. import stages
from ..errors import SymattnError
from ..text import show_bidi
from .labels import upright
from .shades import on
from ..exact.derivation import Derivation

_MAX_LABELS = 32  # tick labels on an axis before they are thinned out
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def figure(d: Derivation):
    """The matplotlib figure :func:`plot_weights` saves (closed by the caller)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        raise SymattnError("plotting needs matplotlib, which is not installed; pip install 'symattn[plot]'") from None
    if not d.can_evaluate:
        raise SymattnError("the weights hold symbols without values, so they cannot be plotted; give values")
    linear = d.problem.linear is not None  # linear attention's weights A_lin, masked where the mask forbids
    weights = [s for s in d.steps if s.key == (stages.A_LIN if linear else stages.A)]
    n_q, n_k = weights[0].shape
    # Cells shrink as n grows so that a panel stays slide-sized (at most about 11 × 10 inches,
    # 1650 × 1500 px at 150 dpi); tick labels keep a readable size and are thinned out instead.
    cell = min(0.45, 9.0 / max(n_q, n_k))
    size = max(3.0, cell * n_k + 1.5), max(2.5, cell * 0.4 / 0.45 * n_q + 1.2)
    font = None if max(n_q, n_k) <= 16 else 8  # None: matplotlib's own size
    step_q, step_k = (max(1, math.ceil(n / _MAX_LABELS)) for n in (n_q, n_k))
    fig, axes = plt.subplots(1, len(weights), figsize=(size[0] * len(weights), size[1]), squeeze=False)
    for ax, step in zip(axes[0], weights):
        values = np.array([[float(v) for v in row] for row in d.evaluate(step.id, 20)])
        masked = (~np.array(d.problem.mask.allowed, dtype=bool) if linear else
                  np.array([[e is None for e in row.exponents] for row in step.softmax]))
        image = ax.imshow(np.ma.masked_array(values, masked), cmap="Blues", vmin=0, vmax=1)
        ax.set_facecolor("#d9d9d9")
        for i in range(n_q):
            for j in range(n_k):
                if masked[i, j]:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", color="#8c8c8c", lw=0))
                elif n_q <= 16 and n_k <= 16:
                    ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=8,  # AA contrast
                            color=on(image.cmap(image.norm(values[i, j]))[:3]))
        xs, ys = range(0, n_k, step_k), range(0, n_q, step_q)
        ax.set_xticks(xs, labels=[show_bidi(step.cols[j]) for j in xs], fontsize=font)
        for tick, j in zip(ax.get_xticklabels(), xs):  # many columns: long labels turned to fit, short ones upright
            if n_k > 6 and not upright(step.cols[j]):
                tick.set_rotation(45)
                tick.set_horizontalalignment("right")
        ax.set_yticks(ys, labels=[show_bidi(step.rows[i]) for i in ys], fontsize=font)
        ax.set_xlabel("key" + (f" (one token in {step_k} labelled)" if step_k > 1 else ""))
        ax.set_ylabel("query" + (f" (one token in {step_q} labelled)" if step_q > 1 else ""))
        name = stages.A_LIN if linear else stages.A
        ax.set_title(f"Head {step.head}: weights {name}" if step.head else f"Attention weights {name}")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def plot_weights(d: Derivation, suffix: str = ".png") -> bytes:
    """A heat map of each head's weights A (one panel per head) as PNG, SVG or PDF bytes.

    Rows are the query tokens, columns the key tokens, each cell is labelled
    with its weight; masked cells are hatched grey, so they never look like
    small weights.
    """
    if suffix not in FORMATS:
        raise SymattnError(f"a plot is written as .png, .svg or .pdf, not {suffix or 'a file without a suffix'}")
    fig = figure(d)
    import matplotlib.pyplot as plt

    out = io.BytesIO()
    fig.savefig(out, format=FORMATS[suffix], dpi=150, metadata={"Software": None} if suffix == ".png" else None)
    plt.close(fig)
    return out.getvalue()
