"""The prairielearn writer (see :mod:`symattn.lms`): one PrairieLearn question folder.

* ``info.json``: a v3 question whose ``uuid`` follows from the run (its variants, asked stages
  and places): the same seed writes the same uuid, so a re-import updates the question;
* ``question.html``: the statement, a ``pl-matrix-component-input`` per asked stage (an input
  box per entry; an entry shown as −∞ may be left empty), the marking's feedback in the
  submission panel and the worked solution in the answer panel. It is a Mustache template:
  the user's text reaches it only through ``params``, escaped for HTML by symattn, and Mustache
  does not read a value it inserts, so a token ``{{x}}`` or ``<script>`` stays text;
* ``server.py``: :mod:`.prairielearn_server`'s source, as is (standard library only);
* ``variants.json``: every variant precomputed: statement and worked solution as HTML, the
  problem's YAML (which symattn check marks against), and for each asked stage its keys as
  decimal text (the exact value to ``places + 6`` places; null where it is −∞).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from ..check.gradescope import stage_names
from .question import Asked, half_unit, tex_html, text_html

FILES = ["info.json", "question.html", "server.py", "variants.json"]
_NAMESPACE = uuid.UUID("6f1c6a3e-2b1d-5c4e-9a7f-53796d617474")

_HTML = """<pl-question-panel>
{{{params.statement}}}
</pl-question-panel>
{{#params.stages}}
<p>{{{prompt}}}</p>
<pl-matrix-component-input answers-name="{{name}}" rows="{{rows}}" columns="{{cols}}" aria-label="{{label}}"
  comparison="decdig" digits="{{places}}" allow-feedback="true"{{#blank}} allow-blank="true"{{/blank}}>
</pl-matrix-component-input>
{{/params.stages}}
<pl-submission-panel>
<div class="tex2jax_ignore mathjax_ignore">
{{#feedback.stages}}
<p><strong>{{heading}}</strong></p>
<ul>
{{#lines}}
<li>{{.}}</li>
{{/lines}}
</ul>
{{/feedback.stages}}
{{#feedback.marking}}
<p>{{feedback.marking}}</p>
{{/feedback.marking}}
</div>
</pl-submission-panel>
<pl-answer-panel>
{{{params.solution}}}
</pl-answer-panel>
"""


def files(count: int) -> list[str]:
    return list(FILES)


def server_source() -> bytes:
    """The question's ``server.py``: :mod:`.prairielearn_server` as it is on disk."""
    return Path(__file__).with_name("prairielearn_server.py").read_bytes()


def write(run, batch) -> None:
    from ..generate.batch import derivation_of

    questions = run.questions()
    variants = []
    for p, q in zip(run.problems, questions):
        headings = stage_names(derivation_of(p))
        variants.append({"statement": q.statement(lambda a: ""), "solution": q.feedback,
                         "problem": _problem(p),
                         "asked": [_asked(a, n + 1, headings.get(a.id, a.id), run.places)
                                   for n, a in enumerate(q.asked)]})
    seed = json.dumps({"places": run.places, "ask": sorted(run.ask) if run.ask else None,
                       "problems": [_problem(p) for p in run.problems]}, sort_keys=True)
    info = {"uuid": str(uuid.uuid5(_NAMESPACE, seed)), "title": questions[0].title, "topic": "Attention",
            "tags": ["symattn"], "type": "v3"}
    batch.write("info.json", (json.dumps(info, indent=2) + "\n").encode())
    batch.write("question.html", _HTML.encode())
    batch.write("server.py", server_source())
    batch.write("variants.json", (json.dumps(variants, indent=1, sort_keys=True) + "\n").encode())


def _problem(p) -> str:
    """The variant's YAML without its first line, which names the folder written to."""
    text = p.to_yaml()
    return text.partition("\n")[2] if text.startswith("# Made by:") else text


def _asked(a: Asked, number: int, heading: str, places: int) -> dict:
    """One asked stage as server.py reads it: ``name`` is its input's (``stage1_``: the input names
    its entries ``stage1_1``, ``stage1_2``, ...; a name ending in a digit could collide)."""
    masked = any(isinstance(e, str) for row in a.entries for e in row)
    rows, cols = a.shape
    prompt = (f"<strong>{text_html(heading)}</strong>: {tex_html(a.symbol)} ({rows}×{cols}), each entry to {places} "
              "decimal places" + (" (leave an entry that is \\(-\\infty\\) empty)" if masked else "") + ".")
    return {"id": a.id, "name": f"stage{number}_", "heading": heading, "prompt": prompt, "places": places,
            "tolerance": half_unit(places),
            "keys": [[None if isinstance(e, str) else e.key for e in row] for row in a.entries]}
