"""The problem: what a YAML file (or a checkpoint and token ids) asks symattn to derive.

:func:`load_problem` reads a file or YAML text into a :class:`Problem`; every field is
checked where it is written, and a refusal names the file, line, column and field.
"""

from __future__ import annotations

from .load import load_problem, parse_problem
from .masks import Mask
from .model import Backward, Head, Positions, Problem, Tiling
from .passes import decode_problem, with_decode

__all__ = ["Backward", "Head", "Mask", "Positions", "Problem", "Tiling", "decode_problem", "load_problem",
           "parse_problem", "with_decode"]
