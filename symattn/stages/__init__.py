"""The stages: the registry of every stage symattn derives, in formula order, and their texts.

Read the modules in this order:

- :mod:`~symattn.stages.ids`: the stage keys (``S_SCALED = "S_scaled"``), the axes, and the
  stage ids (``stage_id``, ``split_id``: ``"head2.S_scaled"``);
- :mod:`~symattn.stages.kinds`: what a row is made of (``Kind``, ``Context``, ``Mistake``, ...);
- :mod:`~symattn.stages.registry`: the table itself, ``KINDS``, one row per stage kind in the
  order of the formula, each with its relation and shape in a comment;
- what the rows are written with: :mod:`~symattn.stages.why` (the why texts),
  :mod:`~symattn.stages.formulas`, :mod:`~symattn.stages.shapes` (the shape notes),
  :mod:`~symattn.stages.mistakes` (the common mistakes), :mod:`~symattn.stages.relations`,
  :mod:`~symattn.stages.worked` (entries worked as dot products), :mod:`~symattn.stages.groups`
  (grouped-query attention) and :mod:`~symattn.stages.rows` (builders for families of rows);
- :mod:`~symattn.stages.plan`: a problem's stages in order, and the ids a row's inputs stand for;
- :mod:`~symattn.stages.traces`: which input entries make an entry (the web page's highlights);
- :mod:`~symattn.stages.outline`: the numbered steps of a worked solution;
- :mod:`~symattn.stages.names`: the stage names users write (--from, --to, --ask).

This package imports nothing of the exact engine, so the independent NumPy and PyTorch
references can take their stage ids from it.
"""

from __future__ import annotations

from .groups import kv_cache_size, kv_groups
from .ids import (
    A, A_SINK, A_T, ACC_TILED, B_K, B_O, B_Q, B_V, BIASES, CACHED, CONCAT, CONTEXT, COST_COLUMNS, COSTS, DA, DB_K,
    DB_O, DB_Q, DB_V, DCONCAT, DCONTEXT, DECODE_COST, DK, DK_BACK, DK_ROT, DO, DO_HEAD, DQ, DQ_BACK, DQ_ROT, DS, DS_MASKED, DV, DW_K, DW_O,
    DW_Q, DW_V, DX, K, K_CACHE, K_ROT, K_T, KEYS, L_TILED, M, M_TILED, NEW, O, O_FINAL, O_T, O_T_DIFF,
    O_TILED, PE, Q, Q_ROT, Q_T, QUERIES, S, S_MASKED, S_SCALED, S_T, SHARED_KV, SINK_AXIS, STEPS, TOKEN_AXES, V,
    V_CACHE, W_K, W_O, W_Q, W_V, X, X_POS, head_sup, head_sup_tex, split_id, stage_id,
)
from .ids import (
    BETA, BETA_POST, GAMMA, GAMMA_POST, H, H_POST, MEAN, MEAN_SQUARE, MS, MS_POST, MU, MU_POST, R, R_HAT, VAR,
    VAR_POST, VARIANCE, X_HAT, X_NORM,
)
from .ids import EBETA, EGAMMA, EMS, EMU, EVAR, TT, X_EMB, X_EMB_HAT
from .ids import CAP_ROW, CAP_ROWS, S_CAPPED, S_TEMP, TEMP_ROW, TEMP_ROWS
from .ids import K_HAT, K_NORM, KN_GAMMA, KN_MS, Q_HAT, Q_NORM, QN_GAMMA, QN_MS
from .ids import DBETA, DBETA_POST, DGAMMA, DGAMMA_POST, DH, DR, DR_HAT, DX_HAT, DX_NORM
from .ids import (
    MLP_MU, MLP_VAR, MLP_MS, H_HAT, MLP_GAMMA, MLP_BETA, H_NORM, W_1, B_1, W_UP, W_2, B_2, W_GATE, U_GATE, W_DOWN, U, U_UP, G, F, Y,
    Y_SUM, Y_HAT, Y_POST, Y_LAST, FINAL_MU, FINAL_VAR, FINAL_MS, Y_FINAL_HAT, FINAL_GAMMA, FINAL_BETA, Y_FINAL, W_U, LOGITS, P, NLL, LOSS, VOCAB, LAST, LOSS_ROWS, NLL_AXIS, LOSS_AXIS,
)
from .ids import (
    DLOGITS, DW_U, DY_FINAL, DY_FINAL_HAT, DFINAL_GAMMA, DFINAL_BETA, DY_LAST, DY, DY_HAT, DMLP_GAMMA_POST, DMLP_BETA_POST, DY_SUM, DF, DB_2,
    DW_2, DW_DOWN, DG, DU, DU_GATE, DU_UP, DB_1, DW_1, DW_GATE, DW_UP, DH_NORM, DH_HAT, DMLP_GAMMA, DMLP_BETA,
)
from .ids import (
    A_LIN, NORMALISER, O_LIN, O_REC, O_REC_DIFF, PHI_K, PHI_Q, REC_DEN, REC_NUM, S_LIN, S_STATE, STATE_COST,
    STATE_COST_COLUMNS, STATE_COSTS, Z_LIN, Z_STATE,
)
from .ids import (
    CACHE_KINDS, CACHE_WIDTHS, CACHE_WIDTH_COLUMNS, C_KV, C_Q, K_C, K_R, K_R_ROT, MLA_CACHE, MLA_K, MLA_Q, MLA_V,
    MLA_W_Q, Q_ABS, Q_C, Q_R, Q_R_ROT, S_ABS, S_ABS_DIFF, W_DKV, W_DQ, W_KR, W_QR, W_UK, W_UQ, W_UV,
)
from .ids import C_KV_NORM, C_Q_NORM, CQ_NORM_MS, KV_NORM_MS
from .linear import FORMULA as LINEAR_FORMULA
from .mla import cache_kinds, mla_cache_table, times_smaller
from .ids import (
    A_2, A_DIFF, A_DIFF_SUMS, K_2, K_2ROT, O_DIFF, O_MS, O_SUBLN, Q_2, Q_2ROT, ROW_SUM, S_2, S_2MASKED, W_K2, W_Q2,
)
from .differential import FORMULA as DIFFERENTIAL_FORMULA
from .kinds import Context, Dot, Kind, Mistake, Section
from .names import GRADIENT_NAMES, NAMES, TILED_NAMES, order_of, unknown_stage
from .norms import entry_tex, has_norm, hat_keys
from .outline import SECTIONS, section_of, sections
from .plan import Planned, input_ids, plan, resolve
from .registry import BY_KEY, KINDS
from .traces import TRACES, traces
from .worked import dot_at

__all__ = [
    "A", "A_SINK", "A_T", "ACC_TILED", "B_K", "B_O", "B_Q", "B_V", "BIASES", "BY_KEY", "CACHED", "CONCAT", "CONTEXT",
    "COST_COLUMNS", "COSTS", "DA", "DB_K", "DB_O", "DB_Q", "DB_V", "DCONCAT", "DCONTEXT", "DECODE_COST", "DK",
    "DK_BACK", "DK_ROT", "DO", "DO_HEAD", "DQ", "DQ_BACK", "DQ_ROT", "DS", "DS_MASKED", "DV", "DW_K", "DW_O", "DW_Q", "DW_V", "DX", "GRADIENT_NAMES",
    "K", "K_CACHE", "K_ROT", "K_T", "KEYS", "KINDS", "L_TILED", "M", "M_TILED", "NAMES", "NEW", "O",
    "O_FINAL", "O_T", "O_T_DIFF", "O_TILED", "PE", "Q", "Q_ROT", "Q_T", "QUERIES", "S", "S_MASKED",
    "S_SCALED", "S_T", "SECTIONS", "SHARED_KV", "SINK_AXIS", "STEPS", "TILED_NAMES", "TOKEN_AXES", "TRACES", "V",
    "V_CACHE", "W_K", "W_O", "W_Q", "W_V", "X", "X_POS",
    "BETA", "BETA_POST", "GAMMA", "GAMMA_POST", "H", "H_POST", "MEAN", "MEAN_SQUARE", "MS", "MS_POST", "MU",
    "MU_POST", "R", "R_HAT", "VAR", "VAR_POST", "VARIANCE", "X_HAT", "X_NORM",
    "EBETA", "EGAMMA", "EMS", "EMU", "EVAR", "TT", "X_EMB", "X_EMB_HAT",
    "CAP_ROW", "CAP_ROWS", "S_CAPPED", "S_TEMP", "TEMP_ROW", "TEMP_ROWS",
    "K_HAT", "K_NORM", "KN_GAMMA", "KN_MS", "Q_HAT", "Q_NORM", "QN_GAMMA", "QN_MS",
    "MLP_MU", "MLP_VAR", "MLP_MS", "H_HAT", "MLP_GAMMA", "MLP_BETA", "H_NORM", "W_1", "B_1", "W_UP", "W_2", "B_2", "W_GATE", "U_GATE",
    "W_DOWN", "U", "U_UP", "G", "F", "Y", "Y_SUM", "Y_HAT", "Y_POST", "Y_LAST", "FINAL_MU", "FINAL_VAR", "FINAL_MS", "Y_FINAL_HAT",
    "FINAL_GAMMA", "FINAL_BETA", "Y_FINAL", "W_U", "LOGITS", "P", "NLL", "LOSS", "VOCAB", "LAST", "LOSS_ROWS", "NLL_AXIS", "LOSS_AXIS",
    "DLOGITS", "DW_U", "DY_FINAL", "DY_FINAL_HAT", "DFINAL_GAMMA", "DFINAL_BETA", "DY_LAST", "DY", "DY_HAT", "DMLP_GAMMA_POST", "DMLP_BETA_POST", "DY_SUM", "DF", "DB_2",
    "DW_2", "DW_DOWN", "DG", "DU", "DU_GATE", "DU_UP", "DB_1", "DW_1", "DW_GATE", "DW_UP", "DH_NORM", "DH_HAT", "DMLP_GAMMA", "DMLP_BETA",
    "A_LIN", "LINEAR_FORMULA", "NORMALISER", "O_LIN", "O_REC", "O_REC_DIFF", "PHI_K", "PHI_Q", "REC_DEN", "REC_NUM", "S_LIN", "S_STATE",
    "STATE_COST", "STATE_COST_COLUMNS", "STATE_COSTS", "Z_LIN", "Z_STATE",
    "CACHE_KINDS", "CACHE_WIDTHS", "CACHE_WIDTH_COLUMNS", "C_KV", "C_Q", "K_C", "K_R", "K_R_ROT", "MLA_CACHE", "MLA_K",
    "MLA_Q", "MLA_V", "MLA_W_Q", "Q_ABS", "Q_C", "Q_R", "Q_R_ROT", "S_ABS", "S_ABS_DIFF", "W_DKV", "W_DQ", "W_KR",
    "W_QR", "W_UK", "W_UQ", "W_UV", "C_KV_NORM", "C_Q_NORM", "CQ_NORM_MS", "KV_NORM_MS", "mla_cache_table", "cache_kinds", "times_smaller",
    "A_2", "A_DIFF", "A_DIFF_SUMS", "DIFFERENTIAL_FORMULA", "K_2", "K_2ROT", "O_DIFF", "O_MS", "O_SUBLN", "Q_2", "Q_2ROT",
    "ROW_SUM", "S_2", "S_2MASKED", "W_K2", "W_Q2",
    "Context", "Dot", "Kind", "Mistake", "Planned", "Section",
    "dot_at", "entry_tex", "has_norm", "hat_keys", "input_ids", "kv_cache_size", "kv_groups", "order_of", "plan", "resolve", "section_of",
    "head_sup", "head_sup_tex", "sections", "split_id", "stage_id", "traces", "unknown_stage",
]
