"""Why a stage is likely wrong: a common mistake of the registry that reproduces the answer, else an
arithmetic slip, a single wrong entry or rounding slips (the rules are :mod:`symattn.check.marker`'s)."""

from __future__ import annotations

import mpmath

from .. import stages
from ..exact.ops import Undefined
from .answers import DPS, NINF, Answer, Grid
from .verdicts import MAX_WRONG_SHOWN, Diagnosis, entry_name

# A relation that cannot be computed from the values at hand (a shape that does not fit, a row
# with nothing allowed) gives no follow-through and no candidate mistake.
CANNOT = (Undefined, ValueError, IndexError, TypeError, ZeroDivisionError)


def diagnose(marker, step, answer: Answer, exact: Grid, wrong: list[tuple[int, int]]) -> Diagnosis | None:
    """The likely cause of a wrong stage, or None (``marker`` compares entries as the stage was marked)."""
    id = step.id
    fits = []
    for name, candidate in mistakes(marker, step):
        if marker.same_as_written(answer, candidate, exact):
            continue  # this mistake changes nothing here: it cannot be the cause
        if not marker.fit(answer, candidate).wrong:
            fits.append((marker.misfit(answer, candidate), name, candidate))
    if fits:
        fits.sort(key=lambda f: f[0])
        best = fits[0]
        equal = [f[1] for f in fits[1:] if marker.same_as_written(answer, f[2], best[2])]
        if equal:
            names = (best[1], *equal)
            text = best[1] + "; or, giving the same numbers here, " + "; or ".join(equal)
            return Diagnosis("mistake", text, names)
        return Diagnosis("mistake", best[1], (best[1],))
    if len(wrong) == 1:
        i, j = wrong[0]
        given = answer.entries[i][j]
        off = given.approx - exact[i][j] if exact[i][j] != NINF and given.approx != NINF else None
        label = entry_name(id, i, j)
        if off is not None and given.half_unit is None and abs(off - round(off)) < 1e-20 and abs(off) <= 2:
            return Diagnosis("arithmetic slip",
                             f"arithmetic slip: {label} is off by {int(round(off)):+d}; everything else is right",
                             entries=((i, j),))
        if not rounding_slip(marker, answer, exact, i, j):
            return Diagnosis("single entry", f"a single wrong entry: {label}; everything else is right",
                             entries=((i, j),))
    if step.kind_of.slips and all(
        answer.entries[i][j].approx != NINF
        and exact[i][j] != NINF
        and abs(abs(answer.entries[i][j].approx - exact[i][j]) - 1) < 1e-20
        for i, j in wrong
    ) and len(wrong) <= 3:
        places = ", ".join(entry_name(id, i, j) for i, j in wrong)
        return Diagnosis("arithmetic slip", f"arithmetic slips: {places} are each off by 1", entries=tuple(wrong))
    if all(rounding_slip(marker, answer, exact, i, j) for i, j in wrong):
        places = ", ".join(entry_name(id, i, j) for i, j in wrong[:MAX_WRONG_SHOWN])
        more = f" and {len(wrong) - MAX_WRONG_SHOWN} more" if len(wrong) > MAX_WRONG_SHOWN else ""
        what = "rounding slip" if len(wrong) == 1 else "rounding slips"
        verb = "is" if len(wrong) == 1 else "are"
        return Diagnosis("rounding slips",
                         f"{what}: {places}{more} {verb} within two units of the last written place of the exact "
                         "value; round the exact values, not values already rounded", entries=tuple(wrong))
    return None

def rounding_slip(marker, answer: Answer, exact: Grid, i: int, j: int) -> bool:
    """Whether a wrong decimal is within two units of its last written place of the exact value."""
    entry, want = answer.entries[i][j], exact[i][j]
    if entry.half_unit is None or want == NINF or entry.approx == NINF or marker.tolerance is not None:
        return False
    with mpmath.workdps(DPS + 10):
        return abs(entry.approx - want) <= 4 * entry.half_unit

def mistakes(marker, step):
    """(name, values) for each of the stage's common mistakes (see the registry) that can be
    computed for this problem, in the registry's order."""
    c = stages.Context(marker.d.problem, step.head)

    def exact(key: str, head=...) -> Grid:
        return marker.exact(stages.resolve(key, c, head)[0])

    for mistake in step.kind_of.mistakes:
        try:
            candidate = mistake.relation(marker.ops, exact, c)
        except Undefined:
            continue  # this candidate has no value here; the next may
        except CANNOT:
            return
        if candidate is not None:
            yield mistake.name, marker.ops.grid(candidate)
