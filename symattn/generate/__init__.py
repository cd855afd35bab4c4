"""Fresh exercises: :func:`generate` draws distinct variants, :func:`write_exercises` writes a batch.

``symattn.generate`` is this package; calling it calls :func:`generate`.
"""

from __future__ import annotations

import sys
import types

from .batch import GeneratedProblem, exercise_files, generate, write_exercises

__all__ = ["GeneratedProblem", "exercise_files", "generate", "write_exercises"]


class _CallableModule(types.ModuleType):
    """``symattn.generate`` is this package, however it was reached; calling it calls :func:`generate`."""

    def __call__(self, count: int = 1, **options) -> list[GeneratedProblem]:
        return generate(count, **options)


sys.modules[__name__].__class__ = _CallableModule
