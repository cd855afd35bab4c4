"""symattn: transformer attention worked out exactly, stage by stage.

>>> import symattn
>>> d = symattn.derive(symattn.load_problem("Q: [[0, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[2], [4]]\\n"))
>>> d.step("A").exact, d.step("O").exact
(Matrix([[1/2, 1/2]]), Matrix([[3]]))
"""

from ._errors import SymattnError
from .crosscheck import CrossCheck, crosscheck
from .derivation import Derivation, Step, derive
from .problem import Problem, load_problem
from .render import render, render_json, render_latex, render_markdown, render_text

__version__ = "0.1.0"

__all__ = [
    "CrossCheck",
    "Derivation",
    "Problem",
    "Step",
    "SymattnError",
    "crosscheck",
    "derive",
    "load_problem",
    "render",
    "render_json",
    "render_latex",
    "render_markdown",
    "render_text",
]
