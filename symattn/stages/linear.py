"""The rows of linear attention (``linear: {feature: relu}``): the softmax replaced by φ(q_i)·φ(k_j)
over φ(q_i)·Σ_j φ(k_j), in its two forms.

- the parallel form: ``phi_Q``, ``phi_K``, the masked n × n table ``S_lin``, its row sums ``z_lin``
  (the normalisers), the weights ``A_lin`` and the output ``O``;
- the recurrent form, one step per token: the states ``z_state`` (row t is z_t = z_{t−1} + φ(k_t))
  and ``S_state`` (row t is S_t = S_{t−1} + φ(k_t)v_tᵀ, its d_k × d_v entries read row by row),
  ``rec_num`` = φ(q_t)ᵀS_t, ``rec_den`` = φ(q_t)ᵀz_t, ``O_rec`` and ``O_rec_diff`` = O_rec − O, exactly 0;
- ``state_cost``: the state's size against the KV cache's, step by step.

The mask (causal, none, padding) is a 0/1 table built with ``ops.table``: a masked key adds nothing
to a row of the table, nor to the state of that step. The state's d_k·d_v entries are reached with
two 0/1 tables too (``_pick``): column (a−1)·d_v + b of a row holds entry (a, b).
"""

from __future__ import annotations

from .ids import (
    A_LIN, K, NORMALISER, O, O_LIN, O_REC, O_REC_DIFF, PHI_K, PHI_Q, Q, QUERIES, KEYS, REC_DEN, REC_NUM, S_LIN,
    S_STATE, STATE_COST, STATE_COSTS, STEPS, V, Z_LIN, Z_STATE,
)
from .kinds import Context, Dot, Kind, Mistake
from .shapes import flip, plain, prod
from .worked import Pairs

# the headline formula of a linear-attention solution, (LaTeX, plain text); the sums over the allowed keys
FORMULA = ("\\operatorname{Attention}(Q, K, V)_i = \\frac{\\sum_{j} \\bigl(\\varphi(q_i) \\cdot \\varphi(k_j)\\bigr)\\, v_j}"
           "{\\sum_{j} \\varphi(q_i) \\cdot \\varphi(k_j)}",
           "Attention(Q, K, V)_i = Σ_j (φ(q_i)·φ(k_j))·v_j / Σ_j φ(q_i)·φ(k_j)")
FEATURE_WORDS = {"relu": "relu: negative entries become ⟦0⟧", "identity": "the identity: ⟦\\varphi(x) = x⟧",
                 "elu1": "⟦\\operatorname{elu}(x) + 1⟧: ⟦e^{x}⟧ for ⟦x \\le 0⟧ and ⟦x + 1⟧ for ⟦x > 0⟧, so every "
                         "feature is positive (a power of ⟦e⟧ stays exact, shown with certified decimals)"}
NO_NORMALISER = ("the normaliser was left out: the output is not divided by φ(q_i)·Σ_j φ(k_j) (each row's "
                 "weights must sum to 1)")
SCALED = ("scaled by 1/√d_k: linear attention's features take the unscaled q and k (the 1/√d_k belongs to the "
          "softmax's scores)")


def linear(c: Context) -> bool:
    """The problem's attention is linear attention (``linear:``)."""
    return c.linear is not None


def _mask(ops, c: Context):
    """The mask as a 0/1 table: 1 where query i may read key j (and where state t holds key j)."""
    return ops.table([[1 if a else 0 for a in row] for row in c.p.mask.allowed])


def _pick(ops, c: Context, side: str):
    """The 0/1 table that spreads a key's d_k features (``side`` "k") or a value's d_v entries ("v")
    over the d_k·d_v columns of a state: column (a−1)·d_v + b takes feature a, or value entry b."""
    d_k, d_v = c.d_k, c.d_v
    n = d_k if side == "k" else d_v
    at = (lambda col: col // d_v) if side == "k" else (lambda col: col % d_v)
    return ops.table([[1 if at(col) == r else 0 for col in range(d_k * d_v)] for r in range(n)])


def _table(ops, phi_q, phi_k, c: Context):
    """φ(Q)·φ(K)ᵀ with the masked entries 0."""
    return ops.hadamard(ops.matmul(phi_q, ops.T(phi_k)), _mask(ops, c))


def _output(ops, phi_q, phi_k, v, c: Context):
    """The parallel form's output from the features: (table / its row sums)·V."""
    table = _table(ops, phi_q, phi_k, c)
    return ops.matmul(ops.divide_rows(table, ops.matmul(table, ops.ones(c.p.n_k, 1))), v)


def _scaled_features(ops, ex, c: Context, key: str):
    return ops.activate(ops.scale(ex(key), c.factor), c.linear)


class _Columns:
    """A matrix read as its transpose (``m[j, k]`` at ``[k, j]``): φ(K)'s rows as the columns of φ(K)ᵀ."""

    def __init__(self, m) -> None:
        self.m, self.rows = m, m.cols

    def __getitem__(self, kj):
        k, j = kj
        return self.m[j, k]


def worked_entry(v, result, c: Context) -> tuple[Dot, ...]:
    """The first query's entry and the last query's for the first key each reads, worked as φ(q_i)·φ(k_j)."""
    phi_q, phi_k = v(PHI_Q), _Columns(v(PHI_K))
    out = []
    for i in dict.fromkeys((0, c.p.n_q - 1)):
        j = next((j for j, ok in enumerate(c.p.mask.allowed[i]) if ok), 0)
        out.append(Dot("(S_{lin})", i, j, f"\\varphi(q_{{{i + 1}}})", f"\\varphi(k_{{{j + 1}}})",
                       Pairs(phi_q, i, phi_k, j), result[i, j]))
    return tuple(out)


def state_costs(c: Context) -> list[list[int]]:
    """Per token t = 1..n: the numbers linear attention keeps (every head's d_k·d_v + d_k, whatever t)
    against the KV cache's t·(d_k + d_v)."""
    sizes = [(c.at(h).d_k, c.at(h).d_v) for h in c.heads]
    state = sum(d_k * d_v + d_k for d_k, d_v in sizes)
    return [[state, t * sum(d_k + d_v for d_k, d_v in sizes)] for t in range(1, c.p.n_q + 1)]


def _mask_words(c: Context, i: str = "i") -> str:
    kinds = c.p.mask.kinds
    causal = "causal" in kinds
    pad = bool(kinds & {"padding", "valid-length"})
    return (f"the keys ⟦j \\le {i}⟧" if causal else "every key") + (" that are real tokens (not padding)" if pad else "")


WHY = {
    PHI_Q: lambda c: (f"Linear attention replaces the softmax by a feature map ⟦\\varphi⟧, here {FEATURE_WORDS[c.linear]}. "
                      "It is applied to each query entry as it is: no ⟦1/\\sqrt{d_k}⟧ scaling (that belongs to the "
                      "softmax's scores)."),
    PHI_K: lambda c: "The same feature map on each key entry.",
    S_LIN: lambda c: ("The parallel form: entry ⟦(i, j)⟧ is ⟦\\varphi(q_i) \\cdot \\varphi(k_j)⟧, how much query ⟦i⟧ takes "
                      f"from key ⟦j⟧, for {_mask_words(c)}; every other entry is ⟦0⟧ (the mask multiplies, it does not "
                      "add ⟦-\\infty⟧). The whole ⟦n \\times n⟧ table is built, as softmax attention builds its scores."),
    Z_LIN: lambda c: ("Each row's normaliser is the sum of its row of the table: ⟦z_i = \\varphi(q_i) \\cdot \\sum_j "
                      "\\varphi(k_j)⟧. It must not be ⟦0⟧ (relu features can vanish: such a problem is refused)."),
    A_LIN: lambda c: "Each row divided by its normaliser: the weights of a row are non-negative for relu and elu1 "
                     "features and sum to ⟦1⟧.",
    O_LIN: lambda c: "Each output row is the weighted sum of the value rows, as in softmax attention.",
    Z_STATE: lambda c: ("The recurrent form reads the tokens one at a time and keeps a state of constant size. Its "
                        "first part is ⟦z_t = z_{t-1} + \\varphi(k_t)⟧, starting from zero: row ⟦t⟧ is the sum of the key "
                        "features seen so far (" + _mask_words(c, "t") + ")."),
    S_STATE: lambda c: ("Its second part is the ⟦d_k \\times d_v⟧ matrix ⟦S_t = S_{t-1} + \\varphi(k_t)\\,v_t^{\\top}⟧ from "
                        "zero, one outer product added per token. Row ⟦t⟧ holds ⟦S_t⟧ read row by row: column "
                        "⟦(a - 1)\\,d_v + b⟧ is its entry ⟦(a, b)⟧."),
    REC_NUM: lambda c: "The numerator of step ⟦t⟧ reads only the state: ⟦\\varphi(q_t)^{\\top} S_t⟧.",
    REC_DEN: lambda c: "The denominator of step ⟦t⟧: ⟦\\varphi(q_t)^{\\top} z_t⟧, the same number as the normaliser ⟦z_t⟧ of the parallel form.",
    O_REC: lambda c: "Step ⟦t⟧'s output: ⟦o_t = \\varphi(q_t)^{\\top} S_t / \\varphi(q_t)^{\\top} z_t⟧.",
    O_REC_DIFF: lambda c: ("The two forms are exactly equal: ⟦\\varphi(q_t)^{\\top} S_t = \\sum_{j} (\\varphi(q_t) \\cdot "
                           "\\varphi(k_j))\\,v_j⟧ is row ⟦t⟧ of the table times ⟦V⟧, and ⟦\\varphi(q_t)^{\\top} z_t⟧ is its "
                           "row sum, only the brackets moved. The difference ⟦O_{rec} - O⟧ simplifies to exactly ⟦0⟧ "
                           "in every entry."),
    STATE_COST: lambda c: ("What each step keeps: linear attention's state is ⟦d_k\\,d_v + d_k⟧ numbers (⟦S_t⟧ and "
                           "⟦z_t⟧), however many tokens came before; softmax attention's KV cache grows by a key and a "
                           "value per token, ⟦t\\,(d_k + d_v)⟧ numbers at step ⟦t⟧ (⟦2 t d⟧ when ⟦d_k = d_v = d⟧). Here "
                           + ", ".join(f"⟦d_k = {c.at(h).d_k}⟧ and ⟦d_v = {c.at(h).d_v}⟧" for h in c.heads[:2])
                           + (" and so on" if len(c.heads) > 2 else "") + (", summed over the heads." if c.multi else ".")),
}


def _kind(key, name, order, section, title, formula, axes, shape, inputs, relation, **kw) -> Kind:
    return Kind(key, name, order, section, title, WHY[key], formula, axes, shape, inputs=inputs, relation=relation,
                when=linear, per_head=kw.pop("per_head", True), **kw)


def linear_rows() -> tuple[Kind, ...]:
    """The parallel form: the features, the masked table, its normalisers, the weights and O."""
    return (
        # φ(Q), entry by entry  (n_q × d_k)
        _kind(PHI_Q, PHI_Q, 9.1, "features", "Feature map of the queries",
              ("\\varphi(Q)", "phi(Q) = φ of each entry of Q"), (QUERIES, "q"), lambda sh, r, c: plain(r, "like Q"),
              (Q,), lambda ops, v, c: ops.activate(v(Q), c.linear), tex="\\varphi(Q)",
              mistakes=(Mistake(SCALED, lambda ops, ex, c: _scaled_features(ops, ex, c, Q)),)),
        # φ(K)  (n_k × d_k)
        _kind(PHI_K, PHI_K, 9.2, "features", "Feature map of the keys",
              ("\\varphi(K)", "phi(K) = φ of each entry of K"), (KEYS, "k"), lambda sh, r, c: plain(r, "like K"),
              (K,), lambda ops, v, c: ops.activate(v(K), c.linear), tex="\\varphi(K)",
              mistakes=(Mistake(SCALED, lambda ops, ex, c: _scaled_features(ops, ex, c, K)),)),
        # S_lin = φ(Q)·φ(K)ᵀ, 0 where masked  (n_q × n_k)
        _kind(S_LIN, S_LIN, 10.1, "linear", "The parallel form: every query against every key",
              ("S_{lin} = \\varphi(Q)\\,\\varphi(K)^{\\top} \\circ \\text{mask}",
               "S_lin[i,j] = φ(q_i)·φ(k_j) where allowed, else 0"), (QUERIES, KEYS),
              lambda sh, r, c: prod(sh(PHI_Q), flip(sh(PHI_K)), "n_q × n_k"), (PHI_Q, PHI_K),
              lambda ops, v, c: _table(ops, v(PHI_Q), v(PHI_K), c), tex="S_{lin}", worked=worked_entry,
              mistakes=(Mistake(SCALED, lambda ops, ex, c: ops.scale(_table(ops, ex(PHI_Q), ex(PHI_K), c), c.factor)),)),
        # z_lin = S_lin·1, the normalisers φ(q_i)·Σ_j φ(k_j)  (n_q × 1)
        _kind(Z_LIN, Z_LIN, 10.2, "linear", "The normalisers",
              ("z_i = \\sum_j (S_{lin})_{ij} = \\varphi(q_i) \\cdot \\sum_j \\varphi(k_j)", "z_i = Σ_j S_lin[i,j]"),
              (QUERIES, NORMALISER), lambda sh, r, c: plain(r, "n_q × 1"), (S_LIN,),
              lambda ops, v, c: ops.matmul(v(S_LIN), ops.ones(c.p.n_k, 1)), tex="z",
              mistakes=(Mistake(SCALED, lambda ops, ex, c: ops.scale(ops.matmul(ex(S_LIN), ops.ones(c.p.n_k, 1)),
                                                                     c.factor)),)),
        # A_lin = S_lin / z, row by row  (n_q × n_k)
        _kind(A_LIN, A_LIN, 14.5, "linear", "The weights",
              ("A_{lin} = S_{lin} / z \\text{ (row by row)}", "A_lin[i,j] = S_lin[i,j] / z_i"), (QUERIES, KEYS),
              lambda sh, r, c: plain(r, "n_q × n_k") + ", each row sums to 1", (S_LIN, Z_LIN),
              lambda ops, v, c: ops.divide_rows(v(S_LIN), v(Z_LIN)), tex="A_{lin}",
              mistakes=(Mistake(NO_NORMALISER, lambda ops, ex, c: ex(S_LIN)),)),
        # O = A_lin·V  (n_q × d_v)
        _kind(O_LIN, O, 15, "output", "Weighted sum of the values", ("O = A_{lin}\\,V", "O = A_lin·V"), (QUERIES, "v"),
              lambda sh, r, c: prod(sh(A_LIN), sh(V), "n_q × d_v"), (A_LIN, V),
              lambda ops, v, c: ops.matmul(v(A_LIN), v(V)),
              mistakes=(Mistake(NO_NORMALISER, lambda ops, ex, c: ops.matmul(ex(S_LIN), ex(V))),
                        Mistake(SCALED, lambda ops, ex, c: _output(ops, _scaled_features(ops, ex, c, Q),
                                                                   _scaled_features(ops, ex, c, K), ex(V), c)))),
    )


def recurrent_rows() -> tuple[Kind, ...]:
    """The recurrent form, one step per token, its equality with the parallel form, and its cost."""
    return (
        # z_state: row t = z_t = Σ_{j allowed at t} φ(k_j)  (n_q × d_k)
        _kind(Z_STATE, Z_STATE, 15.11, "recurrent", "The running sum of the key features",
              ("z_t = z_{t-1} + \\varphi(k_t)", "z_t = z_(t−1) + φ(k_t), from zero"), (QUERIES, "k"),
              lambda sh, r, c: plain(r, "n × d_k, row t is z_t"), (PHI_K,),
              lambda ops, v, c: ops.matmul(_mask(ops, c), v(PHI_K)), tex="z_{state}"),
        # S_state: row t = S_t = Σ_{j allowed at t} φ(k_j)v_jᵀ, read row by row  (n_q × d_k·d_v)
        _kind(S_STATE, S_STATE, 15.12, "recurrent", "The running state",
              ("S_t = S_{t-1} + \\varphi(k_t)\\,v_t^{\\top}", "S_t = S_(t−1) + φ(k_t)·v_tᵀ, from zero"), (QUERIES, "s"),
              lambda sh, r, c: plain(r, "n × d_k·d_v, row t is S_t"), (PHI_K, V),
              lambda ops, v, c: ops.matmul(_mask(ops, c), ops.hadamard(ops.matmul(v(PHI_K), _pick(ops, c, "k")),
                                                                      ops.matmul(v(V), _pick(ops, c, "v")))),
              tex="S_{state}"),
        # rec_num: row t = φ(q_t)ᵀS_t  (n_q × d_v)
        _kind(REC_NUM, REC_NUM, 15.13, "recurrent", "Each step's numerator",
              ("\\varphi(q_t)^{\\top} S_t", "rec_num[t] = φ(q_t)ᵀ·S_t"), (QUERIES, "v"),
              lambda sh, r, c: plain(r, "n × d_v"), (PHI_Q, S_STATE),
              lambda ops, v, c: ops.matmul(ops.hadamard(ops.matmul(v(PHI_Q), _pick(ops, c, "k")), v(S_STATE)),
                                           ops.T(_pick(ops, c, "v"))), tex="\\text{num}"),
        # rec_den: row t = φ(q_t)ᵀz_t  (n_q × 1)
        _kind(REC_DEN, REC_DEN, 15.14, "recurrent", "Each step's denominator",
              ("\\varphi(q_t)^{\\top} z_t", "rec_den[t] = φ(q_t)ᵀ·z_t"), (QUERIES, NORMALISER),
              lambda sh, r, c: plain(r, "n × 1"), (PHI_Q, Z_STATE),
              lambda ops, v, c: ops.matmul(ops.hadamard(v(PHI_Q), v(Z_STATE)), ops.ones(c.d_k, 1)), tex="\\text{den}"),
        # O_rec = rec_num / rec_den, row by row  (n_q × d_v)
        _kind(O_REC, O_REC, 15.15, "recurrent", "Each step's output",
              ("o_t = \\varphi(q_t)^{\\top} S_t \\,/\\, \\varphi(q_t)^{\\top} z_t", "o_t = rec_num[t] / rec_den[t]"),
              (QUERIES, "v"), lambda sh, r, c: plain(r, "n × d_v"), (REC_NUM, REC_DEN),
              lambda ops, v, c: ops.divide_rows(v(REC_NUM), v(REC_DEN)), tex="O_{rec}",
              mistakes=(Mistake(NO_NORMALISER, lambda ops, ex, c: ex(REC_NUM)),)),
        # O_rec − O  (n_q × d_v, exactly 0)
        _kind(O_REC_DIFF, O_REC_DIFF, 15.16, "recurrent", "The same output as the parallel form",
              ("O_{rec} - O", "O_rec − O"), (QUERIES, "v"), lambda sh, r, c: plain(r, "n × d_v") + ", exactly 0",
              (O_REC, O), lambda ops, v, c: ops.difference(v(O_REC), v(O)), tex="O_{rec} - O"),
        # per step t: (d_k·d_v + d_k, t·(d_k + d_v)), summed over the heads  (n × 2)
        _kind(STATE_COST, STATE_COST, 15.19, "state_cost", "The state against the KV cache",
              ("\\text{size}", "size(t) = (d_k·d_v + d_k, t·(d_k + d_v))"), (STEPS, STATE_COSTS),
              lambda sh, r, c: plain(r, "one row per step t = 1..n: the numbers kept"), (),
              lambda ops, v, c: ops.table(state_costs(c)), per_head=False, tex="\\text{size}"),
    )
