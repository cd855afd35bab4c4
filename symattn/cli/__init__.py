"""The ``symattn`` command line: a thin layer over the library.

One module per command (:mod:`.derive`, :mod:`.check`, :mod:`.generate`), each turning its flags
into library calls; :mod:`.options` holds the flags they share, :mod:`.paths` the output files
they refuse and write, and :mod:`.app` the group and the console script, :func:`main`.
"""

from __future__ import annotations

from .app import VERSION, cli, main

__all__ = ["VERSION", "cli", "main"]


def __getattr__(name: str):
    """``with_backward`` and ``with_tiling``, now in :mod:`symattn.problem.passes`, for code that takes them from here."""
    if name in ("with_backward", "with_tiling"):
        from ..problem import passes

        return getattr(passes, name)
    raise AttributeError(f"module 'symattn.cli' has no attribute {name!r}")
