"""The prairielearn writer (see :mod:`symattn.lms`): one PrairieLearn question folder.

Every variant is precomputed into ``variants.json`` (statement and worked solution as HTML,
each asked stage's keys as decimal text); ``server.py`` needs only Python's standard library:
``generate(data)`` picks variant ``variant_seed % N``, ``grade(data)`` marks each entry with
``symattn check``'s rounding rule. No symattn in the course's image is needed.
"""

from __future__ import annotations

import json
import uuid

FILES = ["info.json", "question.html", "server.py", "variants.json"]
_NAMESPACE = uuid.UUID("6f1c6a3e-2b1d-5c4e-9a7f-53796d617474")

_HTML = """<pl-question-panel>
{{{params.statement}}}
</pl-question-panel>
{{#params.stages}}
<p>\\({{{symbol}}}\\) ({{rows}}&times;{{cols}}), {{places}} decimal places:</p>
<pl-matrix-input answers-name="{{name}}"></pl-matrix-input>
{{/params.stages}}
<pl-answer-panel>
{{{params.solution}}}
</pl-answer-panel>
"""

_SERVER = '''"""PrairieLearn question written by symattn generate --lms prairielearn (data, not code: variants.json)."""
import json
import os
from decimal import Decimal, InvalidOperation

_HERE = os.path.dirname(os.path.abspath(__file__))


def _variants():
    with open(os.path.join(_HERE, "variants.json"), encoding="utf-8") as f:
        return json.load(f)


def generate(data):
    vs = _variants()
    v = vs[int(data["variant_seed"]) % len(vs)]
    data["params"]["statement"] = v["statement"]
    data["params"]["solution"] = v["solution"]
    data["params"]["stages"] = [{"name": "s%d" % i, "symbol": a["symbol"], "rows": len(a["keys"]),
                                 "cols": len(a["keys"][0]), "places": a["places"]} for i, a in enumerate(v["asked"])]
    data["params"]["variant"] = vs.index(v)
    for i, a in enumerate(v["asked"]):
        data["correct_answers"]["s%d" % i] = {"_type": "ndarray", "_value": [[None if k is None else float(k) for k in row] for row in a["keys"]], "_dtype": "float64"}


def _entry(value):
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def grade(data):
    v = _variants()[data["params"]["variant"]]
    total, lines = 0.0, []
    for i, a in enumerate(v["asked"]):
        name = "s%d" % i
        sub = data["submitted_answers"].get(name)
        if isinstance(sub, dict) and "_value" in sub:
            sub = sub["_value"]
        tol = Decimal(a["tolerance"])
        wrong, count = [], 0
        for r, row in enumerate(a["keys"]):
            for c, key in enumerate(row):
                if key is None:
                    continue
                count += 1
                got = None
                try:
                    got = _entry(sub[r][c])
                except (TypeError, IndexError, KeyError):
                    pass
                if got is None or abs(got - Decimal(key)) > tol:
                    wrong.append("row %d, column %d" % (r + 1, c + 1))
        score = (count - len(wrong)) / count if count else 1.0
        feedback = "right" if not wrong else "wrong at " + "; ".join(wrong)
        data["partial_scores"][name] = {"score": score, "feedback": feedback}
        total += score
        lines.append("%s: %s" % (a["id"], feedback))
    data["score"] = total / len(v["asked"]) if v["asked"] else 1.0
    data["feedback"]["marking"] = "\\n".join(lines)
'''


def files(count: int) -> list[str]:
    return list(FILES)


def write(run, batch) -> None:
    qs = run.questions()
    variants = [{"statement": q.statement(lambda a: ""), "solution": q.feedback,
                 "asked": [{"id": a.id, "symbol": a.symbol, "tolerance": a.entries and _tol(a), "places": run.places,
                            "keys": [[e.key if not isinstance(e, str) else None for e in row] for row in a.entries]}
                           for a in q.asked]} for q in qs]
    seed = json.dumps({"places": run.places, "ask": sorted(run.ask) if run.ask else None,
                       "problems": [p.to_yaml().partition("\n")[2] for p in run.problems]}, sort_keys=True)
    info = {"uuid": str(uuid.uuid5(_NAMESPACE, seed)), "title": qs[0].title, "topic": "Attention",
            "tags": ["symattn"], "type": "v3"}
    batch.write("info.json", (json.dumps(info, indent=2) + "\n").encode())
    batch.write("question.html", _HTML.encode())
    batch.write("server.py", _SERVER.encode())
    batch.write("variants.json", (json.dumps(variants, indent=1, sort_keys=True) + "\n").encode())


def _tol(a) -> str:
    return a.blanks[0].tolerance if a.blanks else "0"
