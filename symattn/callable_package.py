"""A package that is also its main function: ``symattn.check(...)``, ``symattn.generate(...)``,
``symattn.render(...)``.

``import symattn.check`` binds the name ``check`` on ``symattn`` to the package, whichever way it
was reached first, so the package itself must be callable: :func:`make_callable` gives its module
object a class whose call is the function (with the function's own signature and docstring for
``help`` and ``inspect``).
"""

from __future__ import annotations

import sys
import types
from typing import Callable


def make_callable(module_name: str, function: Callable) -> None:
    """Calling the module ``module_name`` (already imported: call this at its end) calls ``function``."""
    def signature(self):
        import inspect

        return inspect.signature(function)

    kind = type(f"Callable{module_name.rpartition('.')[2].title()}Package", (types.ModuleType,), {
        "__call__": staticmethod(function),  # module(...) is function(...), with no module in between
        "__signature__": property(signature),  # what inspect and help show: the function's, whole
        "__doc__": f"{module_name}, callable: calling it calls {function.__module__}.{function.__qualname__}.",
    })
    sys.modules[module_name].__class__ = kind
