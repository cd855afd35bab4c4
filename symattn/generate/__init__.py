"""Fresh exercises: :func:`generate` draws distinct variants, :func:`write_exercises` writes a batch.

``symattn.generate`` is this package; calling it calls :func:`generate`.
"""

from __future__ import annotations

from ..callable_package import make_callable
from .batch import GeneratedProblem, exercise_files, generate, write_exercises

__all__ = ["GeneratedProblem", "exercise_files", "generate", "write_exercises"]


make_callable(__name__, generate)  # symattn.generate is this package; calling it calls generate()
