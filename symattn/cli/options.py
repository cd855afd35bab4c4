"""The flags several commands share, as decorators, and the parameter types and callbacks they use.

Each decorator takes its help text: the same flag reads differently under ``derive`` and ``check``.
"""

from __future__ import annotations

from pathlib import Path

import click


class _WholeText:
    """Click's integer types reading the text with :func:`symattn.text.whole_number`: the digits
    0-9 alone, and no more of them than any count or seed has, checked before the conversion
    (Python's guard on long integers is lifted in :func:`symattn.cli.app.run_command`). Click would
    take '٣' or '1_000' and spend seconds on, then print in full, a 100,000-digit argument."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            from ..text import LongNumber, excerpt, whole_number

            try:
                number = whole_number(value.strip(" "), signed=True)
            except LongNumber as exc:
                self.fail(str(exc), param, ctx)
            if number is None:
                self.fail(f"{excerpt(value)} is not a whole number", param, ctx)
            value = number
        return super().convert(value, param, ctx)


class Whole(_WholeText, click.types.IntParamType):
    pass


class WholeRange(_WholeText, click.IntRange):
    pass


def kinds() -> tuple[str, ...]:
    """The stage names --from, --to and --ask take (with heads they apply to every head)."""
    from ..stages.names import NAMES

    return NAMES


def stage_name(value: str | None, option: str) -> str | None:
    """A stage name for --from or --to, with a did-you-mean when it is not one."""
    if value is None or value in kinds():
        return value
    from ..stages.names import unknown_stage

    raise click.BadParameter(unknown_stage(value, kinds()), param_hint=f"'{option}'")


def stage_names(ctx, param, value: str | None) -> frozenset[str] | None:
    """The stage names of derive's --ask, comma-separated; :func:`asked_in` checks them against the
    problem's own stages once it is derived."""
    if value is None:
        return None
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    if not names:
        raise click.BadParameter("nothing: give stage ids, such as Q,S_scaled,A,O")
    return names


def asked_in(derivation, ask: frozenset[str] | None) -> None:
    """Refuse (a usage error naming the problem's stages) a name of ``ask`` that is not a stage of
    ``derivation``: an exercise never silently leaves out a stage it was asked for."""
    if ask is None:
        return
    kinds_here = list(dict.fromkeys(s.kind for s in derivation.steps))
    missing = sorted(ask - set(kinds_here))
    if not missing:
        return
    from ..stages.names import GRADIENT_NAMES
    from ..text import did_you_mean

    name = missing[0]
    if name in kinds():
        what = "is not a stage of this problem" + (" (a gradient: add --backward)" if name in GRADIENT_NAMES else "")
    else:
        what = "is not a stage"
    others = f" (nor is {', '.join(missing[1:])})" if missing[1:] else ""
    raise click.BadParameter(f"{name} {what}{did_you_mean(name, kinds_here)}{others}; "
                             f"choose from {', '.join(kinds_here)}", param_hint="'--ask'")


def stage_list(ctx, param, value: str | None) -> frozenset[str] | None:
    """The stage names of --ask, comma-separated, each checked."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    known = kinds()
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        from ..text import did_you_mean

        hint = did_you_mean(unknown[0], known) if unknown else ""
        if len(known) <= 20:
            raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}{hint}: choose from {', '.join(known)}")
        raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}{hint}: not a stage; give stage ids as the worked "
                                 "solution and `symattn derive -f json` name them, such as S,A,O")
    return frozenset(names)


def output_option(help: str):
    """``-o/--output PATH``."""
    return click.option("-o", "--output", type=click.Path(path_type=Path), help=help)


def backward_option(help: str):
    """``--backward``: the gradients too."""
    return click.option("--backward", is_flag=True, help=help)


def tiled_option(help: str):
    """``--tiled B``: the online softmax over blocks of B keys too."""
    return click.option("--tiled", type=WholeRange(min=1), metavar="B", help=help)


def max_size_option(help: str):
    """``--max-size``: the size budget."""
    return click.option("--max-size", type=WholeRange(min=1), default=1_000_000, show_default=True, help=help)
