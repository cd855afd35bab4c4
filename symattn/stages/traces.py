"""Which entries of its inputs make each entry of a stage (the web page highlights them)."""

from __future__ import annotations

from .ids import (
    A, ACC_TILED, A_T, B_K, B_O, B_Q, B_V, CONCAT, DA, DB_K, DB_O, DB_Q, DB_V, DK, DK_BACK, DK_ROT, DO, DQ,
    DQ_BACK, DQ_ROT, DS, DS_MASKED, DV,
    DW_K, DW_Q, DW_V, K, K_CACHE, K_ROT, K_T, L_TILED, M, M_TILED, O, O_FINAL, O_T, O_TILED, O_T_DIFF, PE, Q,
    Q_ROT, S, S_MASKED, S_SCALED, S_T, TT, V, V_CACHE, W_K, W_O, W_Q, W_V, X, X_POS,
)
from .ids import (
    BETA, BETA_POST, GAMMA, GAMMA_POST, H, H_POST, MS, MS_POST, MU, MU_POST, R, R_HAT, VAR, VAR_POST, X_HAT, X_NORM,
)
from .ids import EBETA, EGAMMA, EMS, EMU, EVAR, X_EMB, X_EMB_HAT
from .ids import DBETA, DBETA_POST, DGAMMA, DGAMMA_POST, DH, DR, DR_HAT, DX, DX_HAT, DX_NORM
from .kinds import Context, Kind
from .plan import resolve


# Which entries of its inputs make an entry (i, j) of a stage: ``row`` (row i of the input),
# ``col`` (column j), ``row_j`` (row j: the input is transposed in the product, as V in
# dA = dO Vᵀ), ``col_i`` (column i: as A in dV = Aᵀ dO), ``entry`` (entry (i, j)) or ``T``
# (entry (j, i)). The web page highlights them when a reader points at the entry. Input keys as
# in ``Kind.inputs``.
TRACES: dict[str, tuple[tuple[str, str], ...]] = {
    PE: (),
    TT: (),
    X_POS: ((X, "entry"), (PE, "entry"), ("token_types", "entry")),
    EMU: (("embedded", "row"),),
    EVAR: (("embedded", "row"), (EMU, "entry")),
    EMS: (("embedded", "row"),),
    X_EMB_HAT: (("embedded", "row"), (EMU, "row"), (EVAR, "row"), (EMS, "row")),
    X_EMB: ((X_EMB_HAT, "entry"), (EGAMMA, "col"), (EBETA, "col")),
    # a norm: a row's statistics read the whole row; a normalised entry its row's, and the row itself
    MU: (("block", "row"),),
    VAR: (("block", "row"), (MU, "entry")),
    MS: (("block", "row"),),
    X_HAT: (("block", "row"), (MU, "row"), (VAR, "row"), (MS, "row")),
    X_NORM: ((X_HAT, "entry"), (GAMMA, "col"), (BETA, "col")),
    H: (("block", "entry"), ("output", "entry")),
    R: (("block", "entry"), ("output", "entry")),
    MU_POST: ((R, "row"),),
    VAR_POST: ((R, "row"), (MU_POST, "entry")),
    MS_POST: ((R, "row"),),
    R_HAT: ((R, "row"), (MU_POST, "row"), (VAR_POST, "row"), (MS_POST, "row")),
    H_POST: ((R_HAT, "entry"), (GAMMA_POST, "col"), (BETA_POST, "col")),
    Q: (("xq", "row"), (W_Q, "col"), (B_Q, "col")),
    K: (("kv", "row"), (W_K, "col"), (B_K, "col")),
    V: (("kv", "row"), (W_V, "col"), (B_V, "col")),
    Q_ROT: ((Q, "row"),),
    K_ROT: ((K, "row"),),
    K_T: (("k_in", "T"),),
    S: (("q_in", "row"), (K_T, "col")),
    S_SCALED: ((S, "entry"),),
    S_MASKED: ((S_SCALED, "entry"), (M, "entry")),
    A: ((S_MASKED, "row"),),
    O: ((A, "row"), (V, "col")),
    M_TILED: ((S_MASKED, "row"),),
    L_TILED: ((S_MASKED, "row"), (M_TILED, "row")),
    ACC_TILED: ((S_MASKED, "row"), (M_TILED, "row"), (V, "col")),
    O_TILED: ((ACC_TILED, "entry"), (L_TILED, "row")),
    O_FINAL: ((CONCAT, "row"), (W_O, "col"), (B_O, "col")),
    DB_O: ((DO, "col"),),
    DB_Q: ((DQ, "col"),),
    DB_K: ((DK, "col"),),
    DB_V: ((DV, "col"),),
    DV: ((A, "col_i"), (DO, "col")),
    DA: ((DO, "row"), (V, "row_j")),
    DS_MASKED: ((A, "row"), (DA, "row")),
    DS: ((DS_MASKED, "entry"),),
    DQ: ((DS, "row"), (K, "col")),
    DQ_ROT: ((DS, "row"), (K_ROT, "col")),
    DK_ROT: ((DS, "col_i"), (Q_ROT, "col")),
    DQ_BACK: ((DQ_ROT, "row"),),
    DK_BACK: ((DK_ROT, "row"),),
    DK: ((DS, "col_i"), (Q, "col")),
    DW_Q: (("xq", "col_i"), (DQ, "col")),
    DW_K: (("kv", "col_i"), (DK, "col")),
    DW_V: (("kv", "col_i"), (DV, "col")),
    K_CACHE: (("k_in", "entry"),),
    V_CACHE: ((V, "entry"),),
    A_T: ((S_T, "row"),),
    O_T: ((A_T, "row"), (V_CACHE, "col")),
    O_T_DIFF: ((O_T, "entry"),),
    # back through the residual and the norm: dH (from H under a target), dX̂ = dX_norm ∘ γ, the
    # column sums dγ and dβ, and a row of dX (dR) from its row of dX̂, X̂ and the statistics
    DH: (("stream", "entry"),),
    DR_HAT: ((DH, "entry"), (GAMMA_POST, "col")),
    DGAMMA_POST: ((DH, "col"), (R_HAT, "col")),
    DBETA_POST: ((DH, "col"),),
    DR: ((DR_HAT, "row"), (R_HAT, "row"), (VAR_POST, "row"), (MS_POST, "row")),
    DX_HAT: ((DX_NORM, "entry"), (GAMMA, "col")),
    DGAMMA: ((DX_NORM, "col"), (X_HAT, "col")),
    DBETA: ((DX_NORM, "col"),),
}
# dX back through a norm in front (without one, dX sums the paths, and only the residual's entry
# is traced)
_DX_NORMED = ((DX_HAT, "row"), (X_HAT, "row"), (VAR, "row"), (MS, "row"), ("skip", "entry"))


def traces(kind: Kind, c: Context) -> list[tuple[str, str]]:
    """``(stage id, how)`` for each input entry that makes an entry of ``kind`` (see TRACES);
    empty when the stage is given."""
    if kind.is_given(c):
        return []
    if kind.key == DX:
        pairs = _DX_NORMED if c.pre_norm else (("skip", "entry"),)
    elif kind.key == DH and c.loss.kind != "target":
        pairs = ()  # dH is given, or all ones
    else:
        pairs = TRACES.get(kind.key, ())
    return [(i, how) for key, how in pairs for i in resolve(key, c)]
