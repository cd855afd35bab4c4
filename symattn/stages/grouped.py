"""The backward pass of grouped-query attention (kv_heads): a K/V group's keys and values are read
by every query head of the group, so their gradients sum those heads' shares,

    dV⁽ᵍ⁾ = Σ_{h in g} A⁽ʰ⁾ᵀ·dO⁽ʰ⁾        dK⁽ᵍ⁾ = Σ_{h in g} dS⁽ʰ⁾ᵀ·Q⁽ʰ⁾   (dK_rot: Q_rot⁽ʰ⁾ under RoPE)

shown once per group under its first head's ids (head1.dV for group 1), as the forward pass shows
the group's K and V. Without groups each sum has one term: the head's own Aᵀ·dO and dSᵀ·Q.
"""

from __future__ import annotations

from .ids import head_sup, head_sup_tex
from .kinds import Context, Mistake



def group_product(left: str, right: str):
    """The relation Σ_h left⁽ʰ⁾ᵀ·right⁽ʰ⁾ over the query heads that read this head's K/V group."""
    def relation(ops, v, c: Context):
        if not c.grouped:
            return ops.matmul(ops.T(v(left)), v(right))
        return ops.sum([ops.matmul(ops.T(v(left, h)), v(right, h)) for h in c.group_heads])

    return relation


def group_formula(name: tuple[str, str], left: tuple[str, str], right: tuple[str, str]):
    """The formula ``name = leftᵀ·right`` (LaTeX, text), written out term by term over the group's heads."""
    def formula(c: Context) -> tuple[str, str]:
        if not c.grouped:
            return (f"{name[0]} = {left[0]}^{{\\top}} {right[0]}", f"{name[1]} = {left[1]}ᵀ·{right[1]}")
        heads = c.group_heads
        tex = " + ".join(f"{head_sup_tex(left[0], h, True)} {head_sup_tex(right[0], h)}" for h in heads)
        text = " + ".join(f"{left[1]}{head_sup(h)}ᵀ·{right[1]}{head_sup(h)}" for h in heads)
        return f"{name[0]} = {tex}", f"{name[1]} = {text}"

    return formula


def group_why(noun: str):
    """The sentence a group's gradient adds to its why: which heads' shares it sums."""
    def why(c: Context) -> str:
        if not c.grouped:
            return ""
        heads = c.group_heads
        words = ", ".join(str(h) for h in heads[:-1]) + f" and {heads[-1]}"
        every = "both" if len(heads) == 2 else "all"
        return (f" Heads {words} {every} read K/V group {c.p.kv_group(c.head)}'s {noun}, so their gradient is the "
                "sum of the heads' shares, one term per head.")

    return why


ONE_SHARE = ("only one head's share: a K/V group's keys and values are read by every query head of the group, so "
             "their gradient sums the shares of all of them")


def one_share(left: str, right: str) -> Mistake:
    """The group's gradient taken from its first head alone."""
    def relation(ops, ex, c: Context):
        return ops.matmul(ops.T(ex(left)), ex(right)) if c.grouped else None

    return Mistake(ONE_SHARE, relation)


def ungrouped(mistake: Mistake) -> Mistake:
    """A mistake of a head's own gradient that does not apply to a group's sum."""
    def relation(ops, ex, c: Context):
        return None if c.grouped else mistake.relation(ops, ex, c)

    return Mistake(mistake.name, relation)
