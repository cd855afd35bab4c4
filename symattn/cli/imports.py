"""The commands' heavy imports (SymPy, NumPy, flint), made once per process with the collector paused."""

from __future__ import annotations

import sys


class Importing:
    """The commands' heavy imports (SymPy, NumPy, flint) with the cyclic garbage collector
    paused, and what they built frozen afterwards.

    They build a few hundred thousand long-lived objects and no garbage, yet their allocations
    would trigger a dozen collections that walk them all, and every collection of the oldest
    generation after them would walk them again: about a tenth of the 4-token demo, and
    0.04 s of a 128-token derivation. Frozen (``gc.freeze``), they are left out of collections
    for the rest of the process; reference counting still frees everything as usual. Only the
    import that loads SymPy does this, once per process.
    """

    def __enter__(self) -> None:
        import gc

        self._first = "sympy" not in sys.modules
        self._was_enabled = gc.isenabled()
        if self._first:
            gc.disable()

    def __exit__(self, *exc) -> None:
        import gc

        if self._first:
            gc.freeze()
            if self._was_enabled:
                gc.enable()
