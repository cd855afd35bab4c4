"""Which entries of its inputs make each entry of a stage (the web page highlights them)."""

from __future__ import annotations

from .ids import (
    A, ACC_TILED, A_SINK, A_T, B_K, B_O, B_Q, B_V, CONCAT, DA, DB_K, DB_O, DB_Q, DB_V, DK, DK_BACK, DK_ROT, DO, DQ,
    DQ_BACK, DQ_ROT, DS, DS_MASKED, DV,
    DW_K, DW_Q, DW_V, K, K_CACHE, K_ROT, K_T, L_TILED, M, M_TILED, O, O_FINAL, O_T, O_TILED, O_T_DIFF, PE, Q,
    Q_ROT, S, S_CAPPED, S_MASKED, S_TEMP, S_SCALED, S_T, SHARED_KV, TT, V, V_CACHE, W_K, W_O, W_Q, W_V, X, X_POS,
)
from .ids import (
    BETA, BETA_POST, GAMMA, GAMMA_POST, H, H_POST, MS, MS_POST, MU, MU_POST, R, R_HAT, VAR, VAR_POST, X_HAT, X_NORM,
)
from .ids import EBETA, EGAMMA, EMS, EMU, EVAR, X_EMB, X_EMB_HAT
from .ids import DBETA, DBETA_POST, DGAMMA, DGAMMA_POST, DH, DR, DR_HAT, DX, DX_HAT, DX_NORM
from .ids import (
    B_1, B_2, F, FINAL_BETA, FINAL_GAMMA, FINAL_MS, FINAL_MU, FINAL_VAR, G, H_HAT, H_NORM, LOGITS, LOSS,
    MLP_BETA, MLP_BETA_POST, MLP_GAMMA, MLP_GAMMA_POST, MLP_MS, MLP_MS_POST, MLP_MU, MLP_MU_POST, MLP_VAR,
    MLP_VAR_POST, NLL, P, U, U_GATE, U_UP, W_1, W_GATE, W_U, W_UP, Y, Y_FINAL, Y_FINAL_HAT, Y_HAT, Y_LAST, Y_POST,
    Y_SUM,
)
from .ids import (
    A_LIN, O_LIN, O_REC, O_REC_DIFF, PHI_K, PHI_Q, REC_DEN, REC_NUM, S_LIN, S_STATE, Z_LIN, Z_STATE,
)
from .ids import KN_BETA, KN_GAMMA, KN_MS, KN_MU, KN_VAR, K_HAT, K_NORM, QN_BETA, QN_GAMMA, QN_MS, QN_MU, QN_VAR, Q_HAT, Q_NORM
from .kinds import Context, Kind
from .plan import resolve


def _norm(source: str, mu: str, var: str, ms: str, hat: str, gamma: str, beta: str, out: str) -> dict:
    """A norm of ``source``'s rows: a row's statistics read the whole row; a normalised entry its
    row's statistics and the row itself; an output entry its normalised entry, γ and β."""
    return {mu: ((source, "row"),), var: ((source, "row"), (mu, "entry")), ms: ((source, "row"),),
            hat: ((source, "row"), (mu, "row"), (var, "row"), (ms, "row")),
            out: ((hat, "entry"), (gamma, "col"), (beta, "col"))}


# Which entries of its inputs make an entry (i, j) of a stage: ``row`` (row i of the input),
# ``col`` (column j), ``row_j`` (row j: the input is transposed in the product, as V in
# dA = dO Vᵀ), ``col_i`` (column i: as A in dV = Aᵀ dO), ``entry`` (entry (i, j)) or ``T``
# (entry (j, i)). The web page highlights them when a reader points at the entry. Input keys as
# in ``Kind.inputs``.
TRACES: dict[str, tuple[tuple[str, str], ...]] = {
    PE: (),
    TT: (),
    X_POS: ((X, "entry"), (PE, "entry"), ("token_types", "entry")),
    # the norms: the embeddings', the layer's (in front of the attention or behind it), the MLP's
    # (in front or behind) and the final norm
    **_norm("embedded", EMU, EVAR, EMS, X_EMB_HAT, EGAMMA, EBETA, X_EMB),
    **_norm("block", MU, VAR, MS, X_HAT, GAMMA, BETA, X_NORM),
    **_norm(R, MU_POST, VAR_POST, MS_POST, R_HAT, GAMMA_POST, BETA_POST, H_POST),
    **_norm("stream", MLP_MU, MLP_VAR, MLP_MS, H_HAT, MLP_GAMMA, MLP_BETA, H_NORM),
    **_norm(Y_SUM, MLP_MU_POST, MLP_VAR_POST, MLP_MS_POST, Y_HAT, MLP_GAMMA_POST, MLP_BETA_POST, Y_POST),
    **_norm(Q, QN_MU, QN_VAR, QN_MS, Q_HAT, QN_GAMMA, QN_BETA, Q_NORM),
    **_norm(K, KN_MU, KN_VAR, KN_MS, K_HAT, KN_GAMMA, KN_BETA, K_NORM),
    **_norm("final_in", FINAL_MU, FINAL_VAR, FINAL_MS, Y_FINAL_HAT, FINAL_GAMMA, FINAL_BETA, Y_FINAL),
    # the residual sums, entry by entry
    H: (("block", "entry"), ("output", "entry")),
    R: (("block", "entry"), ("output", "entry")),
    Y: (("stream", "entry"), (F, "entry")),
    Y_SUM: (("stream", "entry"), (F, "entry")),
    # the MLP: each token's row on its own, through the hidden units and back
    U: (("mlp_in", "row"), (W_1, "col"), (B_1, "col")),
    U_GATE: (("mlp_in", "row"), (W_GATE, "col")),
    U_UP: (("mlp_in", "row"), (W_UP, "col")),
    G: (("mlp_u", "entry"), (U_UP, "entry")),
    F: ((G, "row"), ("mlp_w2", "col"), (B_2, "col")),
    # the model's head: the last row (rows: last), the logits, their softmax and the loss
    Y_LAST: (("top", "last"),),
    LOGITS: (("unembedded", "row"), (W_U, "col")),
    P: ((LOGITS, "row"),),
    NLL: ((LOGITS, "row"),),
    LOSS: ((NLL, "col"),),
    Q: (("xq", "row"), (W_Q, "col"), (B_Q, "col")),
    K: (("kv", "row"), (W_K, "col"), (B_K, "col")),
    V: (("kv", "row"), (W_V, "col"), (B_V, "col")),
    Q_ROT: (("q_pre", "row"),),
    K_ROT: (("k_pre", "row"),),
    K_T: (("k_in", "T"),),
    S: (("q_in", "row"), (K_T, "col")),
    S_SCALED: ((S, "entry"),),
    S_CAPPED: ((S_SCALED, "entry"),),
    S_MASKED: (("mask_in", "entry"), (M, "entry")),
    S_TEMP: ((S_MASKED, "entry"),),
    A: (("a_in", "row"),),
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
    A_SINK: ((A, "row"),),
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
    # linear attention: a feature from its entry; the table from φ(q_i) and φ(k_j) (0 where masked); the
    # normaliser from its row; a weight from its entry and its row's normaliser; the recurrent form's
    # running sums from the key features' columns, a step from its row of the state
    PHI_Q: ((Q, "entry"),),
    PHI_K: ((K, "entry"),),
    S_LIN: ((PHI_Q, "row"), (PHI_K, "row_j")),
    Z_LIN: ((S_LIN, "row"),),
    A_LIN: ((S_LIN, "entry"), (Z_LIN, "row")),
    O_LIN: ((A_LIN, "row"), (V, "col")),
    Z_STATE: ((PHI_K, "col"),),
    REC_NUM: ((PHI_Q, "row"), (S_STATE, "row")),
    REC_DEN: ((PHI_Q, "row"), (Z_STATE, "row")),
    O_REC: ((REC_NUM, "entry"), (REC_DEN, "row")),
    O_REC_DIFF: ((O_REC, "entry"), (O, "entry")),
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
    if kind.gradient and c.grouped and kind.key in SHARED_KV:  # a K/V group's: a share from each of its heads
        return list(dict.fromkeys((i, how) for h in c.group_heads for key, how in pairs
                                  for i in resolve(key, c, ... if key in SHARED_KV else h)))
    return [(i, how) for key, how in pairs for i in resolve(key, c)]
