"""Builders for families of registry rows made the same way: the weights, biases and projections of
Q, K and V, the RoPE rotations, the gradients of the weights and biases, and the backward pass
through RoPE."""

from __future__ import annotations

from typing import Callable

from .formulas import rope_formula
from .ids import (
    BIASES, B_O, B_V, DK, DK_BACK, DK_ROT, DO, DQ, DQ_BACK, DQ_ROT, DS, DS_MASKED, K, KEYS, K_ROT, Q, QUERIES,
    Q_ROT, SHARED_KV, V, W_K, W_V,
)
from .kinds import Context, Kind, Mistake
from .grouped import group_formula, group_product, group_why, one_share, ungrouped
from .mistakes import ROPE_V_MISTAKES, SCALE_MISSING_DQDK, rope_mistakes, square_product, transposed
from .shapes import flip, is_square, plain, prod
from .why import K_ROT_WHY, WHY, group_note, rope_why, turned_back_why
from .worked import worked_projection


def given_title(cross_title: str, title: str) -> Callable[[Context], str]:
    return lambda c: cross_title if c.cross else title


def weights_row(key: str, order: int, title: str) -> Kind:
    letter = key[-1].lower()
    return Kind(
        key, key, order, "project", title, lambda c, key=key: WHY[key] + group_note(c, key),
        (key.replace("_", "_{", 1) + "}", key),
        ("d", letter), lambda sh, r, c, key=key: plain(r, f"d_model × d_{'v' if key == W_V else 'k'}"),
        source=lambda c, key=key: getattr(c.weights, key) if c.projected else None,
        when=lambda c: c.projected and getattr(c.p, "mla", None) is None, per_head=True, labelled=False,
    )


def projection_row(key: str, order: int, title: str) -> Kind:
    def given_note(r, c):
        return plain(r, {Q: "n_q × d_k", K: "n_k × d_k", V: "n_k × d_v"}[key])

    bias = BIASES[key]

    def shape(sh, r, c):
        if not c.projected:
            return given_note(r, c)
        inp = sh(c.xq) if key == Q else sh(c.kv)
        n = "n_q" if key == Q else "n_k"
        note = prod(inp, sh("W_" + key), f"{n} × {'d_v' if key == V else 'd_k'}")
        return note + (f", plus {bias} ({sh(bias)[0]}×{sh(bias)[1]}) on every row" if c.has_bias(bias) else "")

    def why(c):
        if not c.projected:
            return WHY[f"{key}_given"]
        positions = WHY["positions_used"].format(
            x=c.xq_name, what="the norm of " if c.pre_norm else "the embeddings' norm of " if c.emb_norm else "") \
            if c.positions and (key == Q or not c.cross) else ""
        added = WHY["bias_added"].format(L=key) if c.has_bias(bias) else ""
        return WHY[key] + added + (WHY["cross"] if c.cross and key != Q else "") + positions + group_note(c, key)

    def formula(c):
        if not c.projected:
            return key, key
        name = c.xq_name if key == Q else c.kv_name
        if c.has_bias(bias):
            return f"{key} = {name}\\,W_{{{key}}} + b_{{{key}}}", f"{key} = {c.plain(name)}·W_{key} + {bias}"
        return f"{key} = {name}\\,W_{{{key}}}", f"{key} = {c.plain(name)}·W_{key}"

    def relation(ops, v, c):
        product = ops.matmul(v(c.xq) if key == Q else v(c.kv), v("W_" + key))
        return ops.add_row(product, v(bias)) if c.has_bias(bias) else product

    def unbiased(ops, ex, c):
        if not c.has_bias(bias):
            return None
        return ops.matmul(ex(c.xq) if key == Q else ex(c.kv), ex("W_" + key))

    return Kind(
        key, key, order, lambda c: "project" if c.projected else "given",
        lambda c: {Q: "Queries (given)", K: "Keys (given)", V: "Values (given)"}[key] if not c.projected else title,
        why, formula, (QUERIES if key == Q else KEYS, key.lower()), shape,
        inputs=("xq" if key == Q else "kv", "W_" + key, bias), relation=relation,
        source=lambda c: None if c.projected else getattr(c.p, key),
        per_head=True, slips=True, worked=worked_projection(key), when=lambda c: getattr(c.p, "mla", None) is None,
        mistakes=(transposed(key),) + (ROPE_V_MISTAKES if key == V else ())
        + (Mistake(f"the bias {bias} was not added: {key} = {'X' if key == Q else 'the input'}·W_{key} alone",
                   unbiased),),
    )


def bias_row(key: str, order: float, title: str) -> Kind:
    """A projection's given bias, one 1 × d row (b_Q, b_K, b_V per head; b_O of the layer)."""
    letter = key[-1]
    layer = key == B_O
    return Kind(
        key, key, order, "projection" if layer else "project", title,
        (lambda c: WHY[key] + (group_note(c, W_K) if key in SHARED_KV else "")),
        (f"b_{{{letter}}}", key), ("b", letter.lower()),
        lambda sh, r, c: plain(r, "1 × " + ("d_out" if layer else "d_v" if key == B_V else "d_k")
                               + ", added to every row"),
        source=lambda c: c.bias(key) if c.projected else None,
        when=lambda c: c.has_bias(key) and (c.multi or not layer), per_head=not layer, labelled=False,
    )


def rope_rows() -> tuple[Kind, ...]:
    def row(key: str, base: str, order: float, title: str, noun: str, axis: str) -> Kind:
        return Kind(
            key, key, order, "rotate", title, rope_why(noun, "vector") if base == Q else K_ROT_WHY, rope_formula(base),
            (QUERIES if base == Q else KEYS, axis),
            lambda sh, r, c, base=base: plain(r, f"like {base}: {'n_q' if base == Q else 'n_k'} × d_k"),
            inputs=(base.lower() + "_pre",),
            relation=lambda ops, v, c, base=base: ops.rotate(v(base.lower() + "_pre"), *c.rotation()),
            when=lambda c: c.rope is not None, per_head=True, tex=f"{base}^{{\\mathrm{{rot}}}}",
            shows=frozenset({"rotation"}), mistakes=rope_mistakes(key),
        )

    return (row(Q_ROT, Q, 8.3, "Rotate the queries", "a query", "q"),
            row(K_ROT, K, 8.6, "Rotate the keys", "a key", "k"))


def bias_gradient(key: str, order: float) -> Kind:
    """The gradient of a projection's bias: the column sums of its projection's gradient."""
    g = key[-1]
    layer = g == "O"
    dg = DO if layer else "d" + g

    def rows(c):  # the rows the bias was added to: the query tokens, or the key tokens for K and V
        return c.p.n_k if g in "KV" else c.p.n_q

    def relation(ops, v, c):
        return ops.col_sums(v(dg))

    def averaged(ops, ex, c):
        return ops.scale(ops.col_sums(ex(dg)), ops.rational(1, rows(c)))

    noun = {"Q": "query", "K": "key", "V": "value", "O": "output"}[g]
    return Kind(
        key, key, order, "b_projection" if layer else "b_weights", f"Gradient of the {noun} bias",
        lambda c: WHY["db"].format(L=g) + ((WHY["db_K"] if c.rope is None else WHY["db_K_rope"]) if g == "K" else ""),
        (f"db_{{{g}}} = \\mathbf{{1}}^{{\\top}} d{g}", f"db_{g} = 1ᵀ·d{g} (the column sums of d{g})"),
        ("b", g.lower()), lambda sh, r, c: prod((1, sh(dg)[0]), sh(dg), f"like b_{g}"),
        inputs=(dg,), relation=relation,
        when=lambda c: c.loss is not None and c.has_bias("b_" + g) and (c.multi or not layer),
        per_head=not layer, gradient=True, labelled=False,
        mistakes=(Mistake(f"averaged over the rows instead of summed: db_{g} is the sum of the rows of d{g}",
                          averaged),),
    )


def weight_gradient(key: str, order: int, noun: str) -> Kind:
    g = key[-1]

    def relation(ops, v, c):
        inp = v(c.xq) if g == "Q" else v(c.kv)
        return ops.matmul(ops.T(inp), v("d" + g))

    def formula(c):
        name = c.xq_name if g == "Q" else c.kv_name
        return f"dW_{{{g}}} = {name}^{{\\top}} d{g}", f"dW_{g} = {c.plain(name)}ᵀ·d{g}"

    def why(c):
        text = WHY[key].replace("{C}", c.kv_name)
        return text.replace("X", c.xq_name) if g == "Q" else text

    return Kind(
        key, key, order, "b_weights", f"Gradient of the {noun} weights",
        why, formula, ("d", g.lower()),
        lambda sh, r, c: prod(flip(sh(c.xq) if g == "Q" else sh(c.kv)), sh("d" + g), f"like W_{g}"),
        inputs=("xq" if g == "Q" else "kv", "d" + g), relation=relation,
        when=lambda c: c.projected and c.loss is not None, per_head=True, gradient=True, labelled=False,
        mistakes=(transposed(key, square_only=True),),
    )


def rotated_gradient_rows() -> tuple[Kind, ...]:
    """Under RoPE the scores compared the rotated queries and keys, so the gradient reaches them first:
    dQ_rot = dS·K_rot and dK_rot = dSᵀ·Q_rot (the rows :func:`turned_back_rows` then turn back)."""
    def row(key: str, order: float, noun: str) -> Kind:
        query = key == DQ_ROT
        other = K_ROT if query else Q_ROT
        plain_other = K if query else Q

        def relation(ops, v, c):
            return ops.matmul(v(DS), v(K_ROT)) if query else group_product(DS, Q_ROT)(ops, v, c)

        def unscaled(ops, ex, c):
            return ops.matmul(ex(DS_MASKED), ex(K_ROT)) if query else ops.matmul(ops.T(ex(DS_MASKED)), ex(Q_ROT))

        def unrotated(ops, ex, c):
            return ops.matmul(ex(DS), ex(K)) if query else ops.matmul(ops.T(ex(DS)), ex(Q))

        formula = (("dQ^{\\mathrm{rot}} = dS\\,K^{\\mathrm{rot}}", "dQ_rot = dS·K_rot") if query
                   else group_formula(("dK^{\\mathrm{rot}}", "dK_rot"), ("dS", "dS"), ("Q^{\\mathrm{rot}}", "Q_rot")))
        return Kind(
            key, key, order, "b_qk", f"Gradient of the rotated {noun}",
            WHY[key] if query else (lambda c: WHY[key] + group_why("keys")(c)), formula,
            (QUERIES if query else KEYS, "q" if query else "k"),
            lambda sh, r, c: prod(sh(DS) if query else flip(sh(DS)), sh(other), f"like {Q_ROT if query else K_ROT}"),
            inputs=(DS, other), relation=relation,
            when=lambda c: c.rope is not None and c.loss is not None, per_head=True, gradient=True,
            tex=f"d{'Q' if query else 'K'}^{{\\mathrm{{rot}}}}",
            mistakes=tuple(m if query else ungrouped(m) for m in (
                Mistake(SCALE_MISSING_DQDK, unscaled),
                Mistake(f"the unrotated {'keys' if query else 'queries'} were used: d{'S·K' if query else 'Sᵀ·Q'} "
                        f"instead of d{'S·K_rot' if query else 'Sᵀ·Q_rot'} (the scores compared the rotated "
                        f"{'keys' if query else 'queries'}, {other}, not {plain_other})", unrotated),
                square_product("dSᵀ·K_rot instead of dS·K_rot (dS was transposed)" if query
                               else "dS·Q_rot instead of dSᵀ·Q_rot (dS was not transposed)",
                               lambda ops, ex: ops.T(ex(DS)) if query else ex(DS), lambda ops, ex: ex(other),
                               lambda ex: is_square(ex(DS))),
            )) + (() if query else (one_share(DS, Q_ROT),)) + (transposed(key, square_only=True),),
        )

    return row(DQ_ROT, 25.5, "queries"), row(DK_ROT, 25.7, "keys")


def turned_back_rows() -> tuple[Kind, ...]:
    """dQ and dK under RoPE: each row of dQ_rot and dK_rot turned back by its position's angles,
    R(p·θ)ᵀ = R(−p·θ) (rows named dQ and dK, so dW_Q, dW_K, the biases and dX read them as they are)."""
    def row(key: str, name: str, order: float, noun: str) -> Kind:
        rotated = DQ_ROT if name == DQ else DK_ROT
        letter = name[1]

        def formula(c):
            return (f"d{letter.lower()}_p = R(p\\,\\theta)^{{\\top}} d{letter.lower()}^{{\\mathrm{{rot}}}}_p "
                    f"= R(-p\\,\\theta)\\, d{letter.lower()}^{{\\mathrm{{rot}}}}_p",
                    f"{name}[p] = R(p·θ)ᵀ·{rotated}[p] = R(−p·θ)·{rotated}[p], each pair turned back by p·θ_i")

        return Kind(
            key, name, order, "b_rotate", f"Turn the {noun} gradient back", turned_back_why(noun, letter), formula,
            (QUERIES if name == DQ else KEYS, letter.lower()),
            lambda sh, r, c: plain(r, f"like {letter}: {'n_q' if name == DQ else 'n_k'} × d_k"),
            inputs=(rotated,), relation=lambda ops, v, c: ops.rotate(v(rotated), *c.rotation(), sign=-1),
            when=lambda c: c.rope is not None and c.loss is not None, per_head=True, gradient=True,
            mistakes=(
                Mistake(f"not turned back: d{letter} = {rotated} was copied, but a rotated {noun} depends on the "
                        f"unrotated one through R(p·θ), so its gradient is R(p·θ)ᵀ·{rotated}", lambda ops, ex, c: ex(rotated)),
                Mistake("turned forward (by +p·θ_i) instead of back: the transpose of the rotation R(p·θ) is the "
                        "rotation by −p·θ_i", lambda ops, ex, c: ops.rotate(ex(rotated), *c.rotation())),
                Mistake("positions counted from 1: the first token was turned back by θ_i, but RoPE counts positions "
                        "from 0", lambda ops, ex, c: ops.rotate(ex(rotated), *c.rotation(), sign=-1, offset=1)),
            ),
        )

    return row(DQ_BACK, DQ, 27.5, "query"), row(DK_BACK, DK, 27.7, "key")
