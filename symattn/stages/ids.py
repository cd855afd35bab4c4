"""Stage keys and stage ids: the names every other module uses for the stages.

A key names a row of the registry (:mod:`symattn.stages.registry`); ``name`` (the id without a
head prefix) is what users write. Two rows share a name: the output O of a head and the
projected output of several heads (key "O_final"), and the upstream gradient dO and each head's
share of it (key "dO_head").

Stage ids are made and split here only: ``"S_scaled"``, or ``"head2.S_scaled"`` when the
problem has several heads (:func:`stage_id`, :func:`split_id`). The axes (what a matrix's rows
and columns stand for) are named here too.
"""

from __future__ import annotations

import re


X, CONTEXT, W_Q, W_K, W_V, Q, K, V = "X", "context", "W_Q", "W_K", "W_V", "Q", "K", "V"
K_T, S, S_SCALED, M, S_MASKED, A, O = "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"
CONCAT, W_O, O_FINAL = "concat", "W_O", "O_final"
DO, DW_O, DCONCAT, DO_HEAD = "dO", "dW_O", "dconcat", "dO_head"
DV, DA, DS_MASKED, DS, DQ, DK = "dV", "dA", "dS_masked", "dS", "dQ", "dK"
DW_Q, DW_K, DW_V, DX, DCONTEXT = "dW_Q", "dW_K", "dW_V", "dX", "dcontext"
Q_ROT, K_ROT = "Q_rot", "K_rot"  # the queries and keys rotated by RoPE
# QK-norm (qk_norm:, Qwen 3, OLMo 2, Gemma 3): each head's query and key rows normalised (RMSNorm over
# d_head) before RoPE: the mean square of each row, the normalised rows, γ_q (γ_k) and Q_norm (K_norm),
# which RoPE (or the scores) then read. The K side is shared by a K/V group, as K is.
QN_MU, QN_VAR, QN_MS, QN_GAMMA, QN_BETA, Q_HAT, Q_NORM = (
    "q_norm_mean", "q_norm_var", "q_norm_ms", "q_norm_gamma", "q_norm_beta", "Q_hat", "Q_norm")
KN_MU, KN_VAR, KN_MS, KN_GAMMA, KN_BETA, K_HAT, K_NORM = (
    "k_norm_mean", "k_norm_var", "k_norm_ms", "k_norm_gamma", "k_norm_beta", "K_hat", "K_norm")
# soft-capping (softcap: c): S_capped = c·tanh(S_scaled/c) before the mask, Gemma 2's; temperature
# (temperature: T): S_temp = Ŝ/T after it; each with one row's weights with and without it, side by side
S_CAPPED, S_TEMP, CAP_ROW, TEMP_ROW = "S_capped", "S_temp", "cap_row", "temp_row"
# the backward pass through RoPE: the gradients of the rotated queries and keys, then dQ and dK
# rotated back (keys "dQ_back", "dK_back": rows named dQ and dK, as O_final is named O)
DQ_ROT, DK_ROT, DQ_BACK, DK_BACK = "dQ_rot", "dK_rot", "dQ_back", "dK_back"
# FlashAttention's online softmax (``tiling:`` / ``--tiled B``)
M_TILED, L_TILED, ACC_TILED, O_TILED = "m_tiled", "l_tiled", "acc_tiled", "O_tiled"
PE, X_POS = "PE", "X_pos"
TT = "TT"  # BERT's token-type (segment) embeddings, added with the positions: X_pos = X + PE + TT
# the embeddings' own norm (embeddings_norm:, BERT's embeddings.LayerNorm): the same stages as the
# layer's norm, of X_pos, ending in X_emb, the layer's input (the attention reads it, the residual
# adds to it)
EMU, EVAR, EMS, X_EMB_HAT = "emb_mean", "emb_var", "emb_ms", "X_emb_hat"
EGAMMA, EBETA, X_EMB = "emb_gamma", "emb_beta", "X_emb"
# the layer norm (norm:): each token's mean, variance (LayerNorm) or mean square (RMSNorm), the
# normalised rows, γ and β, and the attention's input X_norm; with place: post the same stages of
# R = X + O (keys with "_post", named as the others) end in H. H: the residual stream X + O.
MU, VAR, MS, X_HAT = "norm_mean", "norm_var", "norm_ms", "X_hat"
GAMMA, BETA, X_NORM = "norm_gamma", "norm_beta", "X_norm"
H, R, R_HAT = "H", "R", "R_hat"
MU_POST, VAR_POST, MS_POST, GAMMA_POST, BETA_POST, H_POST = (
    "norm_mean_post", "norm_var_post", "norm_ms_post", "norm_gamma_post", "norm_beta_post", "H_post")
# the rest of the block (mlp:): the MLP's norm of H (the same stages again, named mlp_mean ... H_norm,
# the MLP's input), its hidden pre-activation U = H_norm·W_1 + b_1 (gated: U_gate and U_up), the
# activation G = act(U) (gated: act(U_gate) ∘ U_up), its output F = G·W_2 + b_2, and the block's
# output Y = H + F; with a post norm (BERT) Y_sum = H + F and its norm (hat Y_hat) is Y.
MLP_MU, MLP_VAR, MLP_MS, H_HAT = "mlp_mean", "mlp_var", "mlp_ms", "H_hat"
MLP_GAMMA, MLP_BETA, H_NORM = "mlp_gamma", "mlp_beta", "H_norm"
W_1, B_1, W_UP, W_2, B_2 = "W_1", "b_1", "W_up", "W_2", "b_2"
W_GATE, U_GATE, W_DOWN = "W_gate", "U_gate", "W_down"  # gated: W_gate and W_up, then W_down
U, U_UP, G, F, Y = "U", "U_up", "G", "F", "Y"
Y_SUM, Y_HAT = "Y_sum", "Y_hat"
MLP_MU_POST, MLP_VAR_POST, MLP_MS_POST, MLP_GAMMA_POST, MLP_BETA_POST, Y_POST = (
    "mlp_mean_post", "mlp_var_post", "mlp_ms_post", "mlp_gamma_post", "mlp_beta_post", "Y_post")
# the model's head (logits:): the last row of Y (rows: last), the final norm (final_mean ...
# Y_final), the unembedding W_U, the logits, the probabilities P = softmax over the vocabulary,
# each row's −log P[i, t_i] (nll) and the loss L, their mean
Y_LAST = "Y_last"
FINAL_MU, FINAL_VAR, FINAL_MS, Y_FINAL_HAT = "final_mean", "final_var", "final_ms", "Y_final_hat"
FINAL_GAMMA, FINAL_BETA, Y_FINAL = "final_gamma", "final_beta", "Y_final"
W_U, LOGITS, P, NLL, LOSS = "W_U", "logits", "P", "nll", "L"
# the backward pass of the model's head and the MLP, with backward: {loss: cross-entropy}: dlogits =
# (P − onehot)/rows, dW_U, the head's input gradient (dY_final, back through the final norm: dY_final_hat,
# dfinal_gamma, dfinal_beta), dY_last (rows: last), dY (the block's output); behind the MLP's post norm
# dY_hat, dmlp_gamma, dmlp_beta (keys with "_post") and dY_sum; then dF, db_2, dW_2 (gated dW_down), dG,
# dU (gated dU_gate, dU_up), db_1, dW_1 (gated dW_gate, dW_up), dH_norm and, back through the MLP's norm,
# dH_hat, dmlp_gamma, dmlp_beta, and dH (the MLP's path plus the residual's)
DLOGITS, DW_U, DY_FINAL, DY_FINAL_HAT = "dlogits", "dW_U", "dY_final", "dY_final_hat"
DFINAL_GAMMA, DFINAL_BETA, DY_LAST, DY = "dfinal_gamma", "dfinal_beta", "dY_last", "dY"
DY_HAT, DMLP_GAMMA_POST, DMLP_BETA_POST, DY_SUM = "dY_hat", "dmlp_gamma_post", "dmlp_beta_post", "dY_sum"
DF, DB_2, DW_2, DW_DOWN, DG = "dF", "db_2", "dW_2", "dW_down", "dG"
DU, DU_GATE, DU_UP, DB_1, DW_1, DW_GATE, DW_UP = "dU", "dU_gate", "dU_up", "db_1", "dW_1", "dW_gate", "dW_up"
DH_NORM, DH_HAT, DMLP_GAMMA, DMLP_BETA = "dH_norm", "dH_hat", "dmlp_gamma", "dmlp_beta"
# the backward pass through them: dH, the upstream gradient on the residual stream H (then dO = dH);
# in front of the attention dX_norm (the projections' paths), dX_hat = dX_norm ∘ γ, dγ, dβ, and dX
# back through the norm (plus dH with the residual); behind it (post) dR_hat = dH ∘ γ, dγ, dβ, dR
# back through the norm, then dO = dR and dX = the paths + dR. The keys with "_post" are named as
# the others.
DH, DX_NORM, DX_HAT, DGAMMA, DBETA = "dH", "dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta"
DR, DR_HAT, DGAMMA_POST, DBETA_POST = "dR", "dR_hat", "dnorm_gamma_post", "dnorm_beta_post"
# the projections' biases (Q = X W_Q + b_Q, ...; O = concat W_O + b_O) and their gradients
B_Q, B_K, B_V, B_O = "b_Q", "b_K", "b_V", "b_O"
DB_Q, DB_K, DB_V, DB_O = "db_Q", "db_K", "db_V", "db_O"
BIASES = {Q: B_Q, K: B_K, V: B_V, O_FINAL: B_O}  # each projection's bias
# decoding one token from the KV cache (decode: t)
K_CACHE, V_CACHE, Q_T, S_T, A_T, O_T = "K_cache", "V_cache", "q_t", "s_t", "a_t", "o_t"
O_T_DIFF, DECODE_COST = "o_t_diff", "step_cost"
# a learned sink (gpt-oss's sink: field): what each row's sink absorbed, 1 − Σ_j a_ij
A_SINK = "A_sink"
# linear attention (linear: {feature: ...}): the features φ(Q) and φ(K); the parallel form's masked
# table S_lin = φ(Q)·φ(K)ᵀ (0 where masked), its row sums z_lin (the normalisers φ(q_i)·Σ_j φ(k_j)),
# the weights A_lin = S_lin / z_lin and the output (key "O_lin", named O); the recurrent form's
# states (row t of z_state is z_t, of S_state the d_k × d_v state S_t read row by row), its
# numerators φ(q_t)ᵀS_t and denominators φ(q_t)ᵀz_t, O_rec and O_rec_diff = O_rec − O (exactly 0); the
# state's size against the KV cache's
PHI_Q, PHI_K, S_LIN, Z_LIN, A_LIN, O_LIN = "phi_Q", "phi_K", "S_lin", "z_lin", "A_lin", "O_lin"
Z_STATE, S_STATE, REC_NUM, REC_DEN, O_REC, O_REC_DIFF = "z_state", "S_state", "rec_num", "rec_den", "O_rec", "O_rec_diff"
STATE_COST = "state_cost"
# multi-head latent attention (mla:, DeepSeek-V2/V3): the given weights (W_DKV, W_KR, W_DQ, the
# up-projections W_UK, W_UV, W_UQ and W_QR, or W_Q; key "mla_W_Q", named W_Q), the latent c_KV = X·W_DKV,
# the one shared key k_R = X·W_KR and k_R_rot = RoPE(k_R), the query latent c_Q = X·W_DQ; per head q_C,
# q_R, q_R_rot, K_C = c_KV·W_UK, and the assembled Q, K, V (keys "mla_Q", "mla_K", "mla_V", named Q, K,
# V); the absorption q_abs = q_C·W_UKᵀ, S_abs = q_abs·c_KVᵀ + q_R_rot·k_R_rotᵀ and S_abs_diff = S_abs − S
# (exactly 0); the cache per token of MLA against MHA and GQA of the same widths
W_DKV, W_KR, W_DQ, W_UK, W_UV, W_UQ, W_QR, MLA_W_Q = "W_DKV", "W_KR", "W_DQ", "W_UK", "W_UV", "W_UQ", "W_QR", "mla_W_Q"
C_KV, K_R, K_R_ROT, C_Q = "c_KV", "k_R", "k_R_rot", "c_Q"
Q_C, Q_R, Q_R_ROT, K_C, MLA_Q, MLA_K, MLA_V = "q_C", "q_R", "q_R_rot", "K_C", "mla_Q", "mla_K", "mla_V"
Q_ABS, S_ABS, S_ABS_DIFF, MLA_CACHE = "q_abs", "S_abs", "S_abs_diff", "mla_cache"
# mla's latent norms (norm_kv:, norm_q:, RMSNorm): each latent row's mean square and the normalised latent
KV_NORM_MS, C_KV_NORM, CQ_NORM_MS, C_Q_NORM = "kv_norm_ms", "c_KV_norm", "cq_norm_ms", "c_Q_norm"
# differential attention (differential: {lambda, W_Q2, W_K2}): the second map's weights and queries and
# keys (rotated under RoPE), its scores S_2 = Q_2·K_2ᵀ, scaled and masked as the first map's, its weights
# A_2; the differential map A_diff = A − λ·A_2 (A is the first map, A₁), its row sums (each 1 − λ) and
# the output (key "O_diff", named O); with the paper's per-head norm (diff_transformer:), each output
# row's mean square and the normalised rows times (1 − λ_init)
W_Q2, W_K2, Q_2, K_2, Q_2ROT, K_2ROT = "W_Q2", "W_K2", "Q_2", "K_2", "Q_2rot", "K_2rot"
S_2, S_2MASKED, A_2, A_DIFF, A_DIFF_SUMS, O_DIFF = "S_2", "S_2masked", "A_2", "A_diff", "A_diff_sums", "O_diff"
O_MS, O_SUBLN = "O_ms", "O_subln"
# With kv_heads (grouped-query attention) these stages exist once per K/V group, under the id of
# the group's first query head (head1.K for group 1); the group's other heads read them. So do
# their gradients: a group's dK and dV sum the shares of every head that reads it.
SHARED_KV = frozenset({"W_K", "W_V", "b_K", "b_V", "K", "V", "K_rot", "K_T", "K_cache", "V_cache", "k_norm_mean",
                       "k_norm_var", "k_norm_ms", "k_norm_gamma", "k_norm_beta", "K_hat", "K_norm",
                       "dK", "dV", "dK_rot", "dK_back", "dW_K", "dW_V", "db_K", "db_V"})

_HEAD_PREFIX = "head"
_HEAD_NUMBER = re.compile(r"[0-9]{1,9}")

# What a matrix's rows or columns stand for: the query tokens, the key tokens, or numbered
# dimensions (any other value: its letter, "d" gives d1, d2, ...).
QUERIES, KEYS = "queries", "keys"
# the vocabulary (a column per word: its word, or its id #j) and the rows the logits are taken of
# (every query token, or the last alone); the rows the loss is taken over
VOCAB, LAST, LOSS_ROWS, NLL_AXIS, LOSS_AXIS = "vocab", "last", "loss rows", "cross-entropy", "loss"
# A decoding step's axes: the cached key tokens 1..t, the new query token t alone, and the
# columns of the cost table.
CACHED, NEW, STEPS, COSTS = "cached", "new", "steps", "costs"
# the two rows of a comparison of one row's weights: without soft-capping (or temperature), then with it
CAP_ROWS, TEMP_ROWS = "softcap rows", "temperature rows"
# the one column of a norm's row statistics, labelled by what it holds
MEAN, VARIANCE, MEAN_SQUARE = "mean", "variance", "mean square"
SINK_AXIS = "sink"  # the one column of what a learned sink absorbed
# linear attention: the one column of the normalisers, and the columns of the state's cost table
NORMALISER, STATE_COSTS = "normaliser", "state costs"
# multi-head latent attention: the rows of the cache table (MLA, MHA, GQA per group count) and its columns
CACHE_KINDS, CACHE_WIDTHS = "cache kinds", "cache widths"
ROW_SUM = "row sum"  # differential attention: the one column of A_diff's row sums
TOKEN_AXES = (QUERIES, KEYS, CACHED, NEW, STEPS, COSTS, CAP_ROWS, TEMP_ROWS, MEAN, VARIANCE, MEAN_SQUARE, VOCAB, LAST,
              LOSS_ROWS, NLL_AXIS, LOSS_AXIS, SINK_AXIS, NORMALISER, STATE_COSTS, CACHE_KINDS, CACHE_WIDTHS,
              ROW_SUM)  # labelled by words, not d1, d2
COST_COLUMNS = ("scores (cache)", "output (cache)", "scores (full)", "outputs (full)")
STATE_COST_COLUMNS = ("state (linear)", "KV cache (softmax)")
CACHE_WIDTH_COLUMNS = ("per token", "for the n tokens")


def stage_id(name: str, head: int | None = None) -> str:
    """The id of stage ``name`` in head ``head`` (1-based; None: a single head or the whole layer).

    >>> stage_id("S_scaled"), stage_id("A", 2)
    ('S_scaled', 'head2.A')
    """
    return name if head is None else f"{_HEAD_PREFIX}{head}.{name}"


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def head_sup(h: int) -> str:
    """Head ``h``'s number as a superscript in text, as the solutions write it: ``O⁽²⁾``."""
    return f"⁽{str(h).translate(_SUPERSCRIPT)}⁾"


def head_sup_tex(name: str, h: int, transposed: bool = False) -> str:
    """``name`` with the head's number in one superscript (and the transpose's):
    ``A^{(2)\\top}``, ``dO^{(2)}``, ``Q^{\\mathrm{rot}\\,(2)}``."""
    top = "\\top" if transposed else ""
    if name.endswith("}") and "^{" in name:  # a superscript already: the head's number goes inside it
        return f"{name[:-1]}\\,({h}){top}}}"
    return f"{name}^{{({h}){top}}}"


def split_id(id: str) -> tuple[int | None, str]:
    """``(head, name)`` of a stage id: ``"head2.A"`` → ``(2, "A")``, ``"O"`` → ``(None, "O")``."""
    prefix, dot, name = id.partition(".")
    # The digits 0-9 only ('²' passes str.isdigit() and breaks int()), and few of them: an id
    # from an answers file with a million-digit head number is no head's, and is not converted.
    if dot and prefix.startswith(_HEAD_PREFIX) and _HEAD_NUMBER.fullmatch(prefix, len(_HEAD_PREFIX)):
        return int(prefix[len(_HEAD_PREFIX):]), name
    return None, id
