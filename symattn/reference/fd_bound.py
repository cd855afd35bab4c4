"""How far a central finite difference of an attention loss may be from the derivative.

The cross-check of ``--backward`` compares every exact gradient with central differences of
the NumPy forward pass. Each difference has two errors: truncation, estimated from the same
difference at half the step (Richardson), and the rounding of the two float64 losses divided
by the step, bounded from the problem's own magnitudes (every operation backward stable,
first order in the unit roundoff). Their sum is each entry's tolerance: derived from the
step and the loss, not guessed, so a large loss over a small step (a value of 10^9 beside
one of 1) widens the bound instead of failing the check. The tests use the same bound.
"""

from __future__ import annotations

import numpy as np

from .. import stages as st

FLOAT64_UNIT_ROUNDOFF = 2.0 ** -53
EXP_ULPS = 4  # exp's error in units in the last place: libm gives 1, NumPy's SIMD loops a few


def central_difference_bound(d_h, d_half, h, rounding, unit_roundoff=FLOAT64_UNIT_ROUNDOFF):
    """How far the central difference ``d_h`` = (f(x + h) − f(x − h)) / 2h may be from f′(x).

    ``d_half`` is the same difference with the step h/2, and ``rounding`` bounds the error of
    one evaluation of f in its arithmetic. Two errors add up:

    - truncation: d(h) = f′ + c·h² + r·c·h² (r·c·h² the terms in h⁴ and beyond), so
      d(h) − d(h/2) = c·h²·(3/4 + 15r/16), and 2·|d(h) − d(h/2)| ≥ |c·h²·(1 + r)| while
      |r| ≤ 1/2 (Richardson; 4/3 would do for the h² term alone). That difference also holds
      both steps' rounding (below: at most rounding/h + 2·rounding/h), so its double adds at
      most 6·rounding/h;
    - rounding: f(x ± h) are each off by at most ``rounding``: (δ₊ + δ₋)/2h ≤ rounding/h.

    Together 2·|d(h) − d(h/2)| + 7·rounding/h, and 3·u·|d(h)| for the difference's own
    subtraction, step and division. Works entrywise on NumPy arrays (an array ``h`` gives
    each entry its own step) and on mpmath numbers (with their ``unit_roundoff``).
    """
    if isinstance(d_h, np.ndarray):
        return 2 * np.abs(d_h - d_half) + 7 * rounding / h + 3 * unit_roundoff * np.abs(d_h)
    return 2 * abs(d_h - d_half) + 7 * rounding / h + 3 * unit_roundoff * abs(d_h)


def _gamma(n: int, unit_roundoff: float) -> float:
    """γₙ = n·u / (1 − n·u): the relative error of n roundings (Higham, §3.1)."""
    assert n * unit_roundoff < 0.5, (n, unit_roundoff)
    return n * unit_roundoff / (1 - n * unit_roundoff)


def _magnitude(kind: str, value: np.ndarray) -> np.ndarray:
    """|value|, and for the softmax's input Ŝ (−∞ where masked) |Ŝ| + |Ŝ − m| + EXP_ULPS on
    its finite entries: Ŝ = scale·S + M rounds by |Ŝ|, z = Ŝ − m by |z|, and exp(z) with
    EXP_ULPS ulps is exp(z + δ) with |δ| ≤ EXP_ULPS·u. Masked entries count 0."""
    value = np.asarray(value, dtype=float)
    if kind != st.S_MASKED:
        return np.abs(value)
    finite = np.isfinite(value)
    top = np.where(finite, value, -np.inf).max(axis=1, keepdims=True)
    return np.where(finite, np.abs(np.where(finite, value, 0)) + np.abs(np.where(finite, value - top, 0))
                    + EXP_ULPS, 0.0)


def _norm_roundings(d: int, norm) -> int:
    """The units of roundoff on each x̂ of a norm over d features, relative to |x̂| (LayerNorm
    x̂ = (x − μ)/r, RMSNorm x̂ = x/r, r = √(stat + ε)), as NumPy computes them (numeric.layer_norm_f64):

    - the variance: each (x − μ)² carries 3 (the subtraction, doubled by the square, and the
      square), their sum of d non-negative terms d − 1, the division by d 1: d + 3 relative to
      σ². (μ's own error moves σ² in the second order only: Σ(x − μ) = 0.) RMSNorm's mean
      square: the square 1, the sum d − 1, the division 1: d + 1;
    - r = √(stat + ε): the addition 1 more (d + 4, RMSNorm d + 2), halved by the root, plus the
      root's own 1: (d + 6)/2 (RMSNorm (d + 4)/2) on r, and the same on 1/r;
    - x̂: LayerNorm's x − μ and the division 2, RMSNorm's division 1;
    - y = x̂·(offset + γ): the product 1 and, with the offset, offset + γ 1 (both put on x̂:
      |∂L/∂x̂|·|x̂| = |∂L/∂y|·|x̂·gain|). β's addition is counted on the norm's output.

    μ's error moves x − μ by an amount not relative to it: :func:`_mean_rounding`."""
    root = (d + 4 + 1) // 2 if norm.rms else (d + 6 + 1) // 2  # rounded up
    own = 1 if norm.rms else 2
    weight = 0 if norm.weight is None else 1 + (1 if norm.offset else 0)
    return root + own + weight


def _mean_rounding(stages: dict, norm, post: bool, dhat: np.ndarray, unit_roundoff: float) -> float:
    """LayerNorm's mean, to first order: fl(Σ x/d) is off by at most γ_d·mean|x| (the sum of d
    terms γ_{d−1}·Σ|x|, the division u·|μ| ≤ u·mean|x|), which moves each x̂ = (x − μ)/r of the
    row by that over r = √(σ² + ε): Σ |∂L/∂x̂|·γ_d·mean|x|/r over the entries."""
    if norm.rms:
        return 0.0
    if post:
        x = stages[st.R]
    else:
        x = stages[st.X_POS] if st.X_POS in stages else stages[st.X]
    x = np.asarray(x, dtype=float)
    r = np.sqrt(np.asarray(stages[st.VAR], dtype=float) + float(norm.eps))  # (n, 1)
    shift = _gamma(x.shape[1], unit_roundoff) * np.abs(x).mean(axis=1, keepdims=True) / r
    return float(np.sum(np.abs(dhat) * shift))


def _roundings(kind: str, value: np.ndarray, final: bool, norm=None, layer_output: bool = False) -> int:
    """How many units of roundoff the pass puts on a stage, relative to its magnitude: the
    inner products are put on one operand each (W in X·W, Q in Q·Kᵀ, A in A·V, W_O in
    concat·W_O), as backward stability allows (Higham, ch. 3). ``final`` marks the stage the
    loss is on (O, or H with a residual stream), ``layer_output`` the layer's output O (not a
    head's)."""
    rows, cols = np.shape(value)
    if final:
        # the loss: its n terms formed (G·O, O − T and its square; none for a sum) and summed
        # (n − 1), and the stage's own rounding (b_O, the residual's B + O, or β) added
        return rows * cols + 2
    if kind in (st.W_Q, st.W_K, st.W_V, st.W_O):
        return rows                     # an inner product of that many terms
    if kind == st.Q:
        return cols + 1                 # S = Q·Kᵀ, d_k terms; the bias b_Q added
    if kind in (st.K, st.V, st.S, st.S_MASKED, st.X, st.X_POS):
        return 1                        # a bias added, the scale, M added (and z, exp: _magnitude), PE added
    if kind == st.A:
        return 2 * cols + 1             # the softmax's sum and division, then A·V
    if kind == st.R or layer_output:
        return 1                        # B + O (R); under the residual, b_O added to the layer's O
    if kind in (st.X_HAT, st.R_HAT):
        return _norm_roundings(cols, norm)
    if kind == st.X_NORM:
        return 0 if norm.bias is None else 1  # β added (γ's product: on X_hat)
    return 0                            # a copy (a head's O in concat), a bias, γ, β (counted where added)


def attention_loss_rounding(stages: dict, gradients: dict, unit_roundoff: float = FLOAT64_UNIT_ROUNDOFF,
                            target=None, norm=None) -> float:
    """A first-order bound on the rounding error of one evaluation of an attention loss.

    ``stages`` holds the forward matrices by symattn's stage ids (``Q``, ``S``, ``S_masked``,
    ``A``, ``O``, ``head1.W_Q``, ``X_pos``, ``X_hat``, ``H``, ...; values as floats),
    ``gradients`` the loss's gradient with respect to each (``dQ``, ``head1.dW_Q``,
    ``dX_hat``, ``dH``, ...), ``target`` the T of ``loss: target``, ``norm`` the problem's
    norm (needed when the stages have one: its ε, γ and offset). Each operation of the pass is
    backward stable: its result is exact for an operand changed by a relative γ_n (an inner
    product of n terms) or u (a scale, a bias, the softmax's division, the residual's sum,
    the loss's own terms). To first order L then moves by at most that relative change times
    Σ |∂L/∂stage|·|stage|: the sum over the stages of γ_k·Σ |gradient|·|stage| with k from
    ``_roundings`` (the softmax's input also carries exp's error, see ``_magnitude``; a
    LayerNorm's mean one not relative to x̂, see ``_mean_rounding``). The loss is on H when
    the stages have the residual stream H, else on O. Terms of order u² are left out.
    """
    final = st.H if st.H in stages else st.O
    total = 0.0
    for gid, g in gradients.items():
        pre, _, name = gid.rpartition(".")
        assert name.startswith("d"), gid
        kind = name[1:]
        of = (pre + "." if pre else "") + kind
        if kind == st.X and st.X_POS in stages:  # X_pos = X + PE feeds the projections
            of = st.X_POS
        value = np.asarray(stages[of], dtype=float)
        if of == final and target is not None:  # ½‖O − T‖²: O − T rounds by |O − T| ≤ |O| + |T|
            magnitude = np.abs(value) + np.abs(np.asarray(target, dtype=float))
        else:
            magnitude = _magnitude(kind, value)
        g = np.asarray(g, dtype=float)
        assert g.shape == magnitude.shape, (gid, g.shape, magnitude.shape)
        if kind in (st.X_HAT, st.R_HAT, st.X_NORM) and norm is None:
            raise ValueError(f"the stages have a norm ({gid}): give attention_loss_rounding its norm")
        k = _roundings(kind, value, final=of == final, norm=norm, layer_output=of == st.O)
        total += _gamma(k, unit_roundoff) * float(np.sum(np.abs(g) * magnitude))
        if kind in (st.X_HAT, st.R_HAT):
            total += _mean_rounding(stages, norm, kind == st.R_HAT, g, unit_roundoff)
    return total


def finite_differences_with_bounds(p, eps: float, gradients: dict | None = None,
                                   stages: dict | None = None) -> tuple[dict, dict]:
    """The central differences of every gradient stage of ``p`` (step ``eps`` relative to each
    entry, see :func:`symattn.reference.numeric_backward.finite_difference_gradients`) and, entry by entry,
    how far each may be from the derivative: the same differences at half the step give the
    truncation, and :func:`attention_loss_rounding` the rounding of the loss, weighed with
    ``gradients`` (the exact ones, in float64) or else with the differences themselves, and the
    forward ``stages`` (by stage id; the NumPy pass's when not given)."""
    from .numeric import numeric_stages
    from .numeric_backward import finite_difference_gradients, loss_matrix

    fd = finite_difference_gradients(p, eps)
    half = finite_difference_gradients(p, eps / 2)
    stages = numeric_stages(p) if stages is None else stages
    target = loss_matrix(p) if p.backward.kind == "target" else None
    weights = {g: (gradients[g] if gradients is not None and g in gradients else d) for g, d in fd.items()}
    rounding = attention_loss_rounding(stages, weights, target=target, norm=p.norm)
    bounds = {}
    for stage, d in fd.items():
        pre, _, name = stage.rpartition(".")
        x = stages.get((pre + "." if pre else "") + name[1:])  # the matrix perturbed: dW_Q -> W_Q
        # the step of finite_difference_gradients, entry by entry (eps, its smallest, if unknown)
        h = eps * np.maximum(1.0, np.abs(x)) if x is not None and np.shape(x) == d.shape else eps
        bounds[stage] = central_difference_bound(d, half[stage], h, rounding)
    return fd, bounds
