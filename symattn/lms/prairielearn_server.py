"""server.py of a PrairieLearn question written by symattn generate --lms prairielearn.

PrairieLearn calls generate(data), parse(data) and grade(data) with its data dictionary. The
variants are data in variants.json next to this file; nothing in them is run as code.

* generate(data) picks variant data["variant_seed"] % N: the same seed, the same variant.
* Each asked stage is a pl-matrix-component-input named stage1_, stage2_, ...; its entries
  are read as the student typed them (data["raw_submitted_answers"]["stage1_1"], ...), never
  through a binary float. parse(data) accepts a decimal written to the asked places or more,
  a whole number, a fraction such as 3/4, and -inf; an entry shown as -inf may be left empty.
* grade(data) marks with symattn check when symattn can be imported (installed with
  PrairieLearn, or in the course's serverFilesCourse/symattn-lib): a stage computed right
  from the student's own wrong earlier answers is right (follow-through), and a wrong stage
  says its likely cause. A stage scores 1 when right, 0 when wrong. Without symattn each
  entry is compared with the exact answer (within half a unit in the asked last place), a
  stage scores the share of its entries right, and data["feedback"] says what is missing.

This file needs only Python's standard library.
"""

import json
import os
import re
import sys
from fractions import Fraction

LIB = "symattn-lib"  # serverFilesCourse/symattn-lib: where a course may install symattn
WITHOUT_SYMATTN = ("Marked against the exact answers only: follow-through from your own earlier answers and the "
                   "likely cause of a mistake need symattn importable by this question's server.py.")
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,2})?\Z")  # 1e-5, not 1e-99999
_FRACTION = re.compile(r"[-+]?[0-9]+/[0-9]*[1-9][0-9]*\Z")
NEG_INF = "-inf"
MAX_TEXT = 60  # characters of one entry


def _variants():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "variants.json"), encoding="utf-8") as f:
        return json.load(f)


def _variant(data):
    return _variants()[int(data["params"]["variant"])]


def generate(data):
    variants = _variants()
    index = int(data["variant_seed"]) % len(variants)
    v = variants[index]
    data["params"]["variant"] = index
    data["params"]["statement"] = v["statement"]
    data["params"]["solution"] = v["solution"]
    data["params"]["stages"] = [{"name": a["name"], "prompt": a["prompt"], "label": a["heading"],
                                 "rows": len(a["keys"]), "cols": len(a["keys"][0]), "places": a["places"],
                                 "blank": _masked(a)} for a in v["asked"]]
    for a in v["asked"]:
        if not _masked(a):  # the answer panel shows it; a -inf is no number the element holds
            data["correct_answers"][a["name"]] = {"_type": "ndarray", "_dtype": "float64",
                                                  "_value": [[float(k) for k in row] for row in a["keys"]]}


def _masked(a):
    return any(k is None for row in a["keys"] for k in row)


def cell_name(a, i, j):
    """The name pl-matrix-component-input gives entry (i, j) (from 0): its own name, then i*columns + j + 1."""
    return a["name"] + str(len(a["keys"][0]) * i + j + 1)


def _cells(data, a):
    """The student's text of each entry, row by row: an empty entry shown as -inf is -inf, another is None."""
    raw = data.get("raw_submitted_answers") or {}
    rows = []
    for i, keys in enumerate(a["keys"]):
        row = []
        for j, key in enumerate(keys):
            text = raw.get(cell_name(a, i, j))
            text = text.strip().replace("\u2212", "-") if isinstance(text, str) else ""
            if text.lower() == NEG_INF:
                text = NEG_INF
            row.append(text or (NEG_INF if key is None else None))
        rows.append(row)
    return rows


def _problem(a, cells):
    """What is wrong with a stage's entries as written, or None: the first entry that cannot be read."""
    for i, row in enumerate(cells):
        for j, text in enumerate(row):
            where = "Row %d, column %d" % (i + 1, j + 1)
            if text is None:
                return where + " is empty: only the entries shown as -inf may be left empty."
            if len(text) > MAX_TEXT:
                return where + " is longer than %d characters." % MAX_TEXT
            if text == NEG_INF or _FRACTION.match(text):
                continue
            if not _DECIMAL.match(text):
                return where + " is not a number: write a decimal such as 0.4231, a fraction such as 3/4, or -inf."
            mantissa, _, exponent = text.lower().partition("e")
            places = len(mantissa.partition(".")[2]) - (int(exponent) if exponent else 0)
            if "." in text or exponent:
                if places < a["places"]:
                    return where + (" is written to %d decimal place%s: write %d (or the exact value, as a whole "
                                    "number or a fraction such as 3/4)." % (max(places, 0), "" if places == 1 else "s",
                                                                            a["places"]))
    return None


def parse(data):
    v = _variant(data)
    for a in v["asked"]:
        if a["name"] not in data["format_errors"]:
            problem = _problem(a, _cells(data, a))
            if problem:
                data["format_errors"][a["name"]] = problem


def _marker(data):
    """symattn's marking for PrairieLearn, or None when symattn cannot be imported."""
    folder = (data.get("options") or {}).get("server_files_course_path")
    if isinstance(folder, str) and os.path.isdir(os.path.join(folder, LIB)):
        lib = os.path.join(folder, LIB)
        if lib not in sys.path:
            sys.path.append(lib)  # after PrairieLearn's own packages: its NumPy and SymPy stay in use
    try:
        from symattn.lms import prairielearn_marking
    except ImportError:
        return None
    return prairielearn_marking


def _exact(v, answers):
    """Each entry against the exact answer, within half a unit in the asked last place (no symattn)."""
    stages = {}
    for a in v["asked"]:
        tolerance, wrong = Fraction(a["tolerance"]), []
        for i, (keys, texts) in enumerate(zip(a["keys"], answers[a["id"]])):
            for j, (key, text) in enumerate(zip(keys, texts)):
                if key is None or text == NEG_INF:
                    right = key is None and text == NEG_INF
                else:
                    right = abs(Fraction(text) - Fraction(key)) <= tolerance
                if not right:
                    wrong.append([i, j])
        count = len(a["keys"]) * len(a["keys"][0])
        lines = ["%s %s: %s" % ("\u2713" if not wrong else "\u2717", a["id"], "every entry right" if not wrong else
                                "%d wrong entr%s" % (len(wrong), "y" if len(wrong) == 1 else "ies"))]
        lines += ["%s[%d,%d]: you wrote %s, which is not right" % (a["id"], i + 1, j + 1, answers[a["id"]][i][j])
                  for i, j in wrong]
        stages[a["id"]] = {"status": "wrong" if wrong else "right", "wrong": wrong, "lines": lines,
                           "score": (count - len(wrong)) / count}
    return {"stages": stages}


def grade(data):
    v = _variant(data)
    answers = {}
    for a in v["asked"]:
        cells = _cells(data, a)
        problem = _problem(a, cells)
        if problem:
            data["format_errors"][a["name"]] = problem
            return
        answers[a["id"]] = cells
    marker = _marker(data)
    marked = _exact(v, answers) if marker is None else marker.verdicts(v["problem"], answers)
    if "error" in marked:  # an entry symattn cannot read: the submission is invalid, not wrong
        data["format_errors"][v["asked"][0]["name"]] = marked["error"]
        return
    shown, total = [], 0.0
    for a in v["asked"]:
        s = marked["stages"][a["id"]]
        wrong = {tuple(w) for w in s["wrong"]}
        entries = {cell_name(a, i, j): "incorrect" if (i, j) in wrong else "correct"
                   for i in range(len(a["keys"])) for j in range(len(a["keys"][0]))}
        data["partial_scores"][a["name"]] = {"score": s["score"], "weight": 1, "feedback": entries}
        data["feedback"][a["name"]] = "\n".join(s["lines"])
        shown.append({"heading": a["heading"], "lines": s["lines"]})
        total += s["score"]
    count = {k: sum(s["status"] == k for s in marked["stages"].values()) for k in ("right", "follows", "wrong")}
    summary = "%d of %d stages right" % (count["right"], len(v["asked"]))
    if count["follows"]:
        summary += ", %d right from your own earlier answers" % count["follows"]
    if count["wrong"]:
        summary += ", %d wrong" % count["wrong"]
    data["feedback"]["stages"] = shown
    data["feedback"]["marking"] = summary + "." + ("" if marker is not None else " " + WITHOUT_SYMATTN)
    data["score"] = total / len(v["asked"]) if v["asked"] else 1.0
