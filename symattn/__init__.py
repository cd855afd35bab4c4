"""symattn: transformer attention worked out exactly, stage by stage.

>>> import symattn
>>> d = symattn.derive(symattn.load_problem("Q: [[0, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[2], [4]]\\n"))
>>> d.step("A").exact, d.step("O").exact
(Matrix([[1/2, 1/2]]), Matrix([[3]]))
"""

from importlib import import_module as _import_module

# The public names, imported on first use: `symattn --help` need not load SymPy.
_EXPORTS = {
    "SymattnError": ".errors",
    "ClassMarking": ".check",
    "Marking": ".check",
    "check": ".check",
    "check_class": ".check",
    "CrossCheck": ".reference.crosscheck",
    "crosscheck": ".reference.crosscheck",
    "Derivation": ".render.display",
    "GeneratedProblem": ".generate",
    "generate": ".generate",
    "write_exercises": ".generate.batch",
    "write_course": ".lms",
    "with_backward": ".problem.passes",
    "with_decode": ".problem.passes",
    "with_tiling": ".problem.passes",
    "Step": ".render.display",
    "derive": ".render.display",
    "Problem": ".problem",
    "load_problem": ".problem",
    "RenderOptions": ".render",
    "render": ".render",
    "render_html": ".render",
    "render_json": ".render",
    "render_latex": ".render",
    "render_markdown": ".render",
    "render_text": ".render",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        module = _import_module(_EXPORTS[name], __name__)
        # a module named as its function is the module itself, callable: symattn.check (see symattn/check/__init__.py)
        value = module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'symattn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__version__ = "0.1.0"

__all__ = [
    "ClassMarking",
    "CrossCheck",
    "Derivation",
    "GeneratedProblem",
    "Marking",
    "Problem",
    "RenderOptions",
    "Step",
    "SymattnError",
    "check",
    "check_class",
    "crosscheck",
    "derive",
    "generate",
    "load_problem",
    "render",
    "render_html",
    "render_json",
    "render_latex",
    "render_markdown",
    "render_text",
    "with_backward",
    "with_decode",
    "with_tiling",
    "write_exercises",
    "write_course",
]
