"""Moodle: one question bank in Moodle XML format, ``moodle.xml`` (see :mod:`symattn.lms`).

The file opens with a ``<question type="category">`` naming ``$course$/top/symattn/<run name>``;
each variant is one Embedded answers (Cloze) question (``type="cloze"``, Moodle's multianswer)
whose text holds, for each asked stage, a grid of NUMERICAL blanks, one per entry:
``{1:NUMERICAL:=key:tolerance#feedback}``. The worked solution is the general feedback.

Moodle's cloze parser reads the question text's raw HTML, so every ``{`` and ``}`` outside a
blank is written as the HTML entity ``&#123;``/``&#125;``: a browser and MathJax read the same
characters, the parser finds no blank in them (a token ``{1:NUMERICAL:=0}`` stays text).
"""

from __future__ import annotations

from ..render.escape import escape_html
from .question import Asked, Blank, Question, tex_html, text_html

FILE = "moodle.xml"
PENALTY = "0.3333333"


def files(count: int) -> list[str]:
    return [FILE]


def write(run, batch) -> None:
    batch.write(FILE, quiz(run.questions(), run.name).encode("utf-8"))


def quiz(questions: list[Question], name: str) -> str:
    """The Moodle XML text of ``questions`` in category ``$course$/top/symattn/<name>``."""
    category = "$course$/top/symattn/" + name.replace("/", "//")  # Moodle reads "//" as a "/" in a name
    out = ['<?xml version="1.0" encoding="UTF-8"?>', "<quiz>",
           '  <question type="category">',
           f"    <category><text>{escape_html(category)}</text></category>",
           "  </question>"]
    out += [cloze(q) for q in questions]
    out.append("</quiz>")
    return "\n".join(out) + "\n"


def cloze(q: Question) -> str:
    """One variant as a cloze question."""
    count = sum(len(a.blanks) for a in q.asked)
    name = q.name + (f" (seed {q.seed})" if q.seed is not None else "") + f": {q.title}"
    text = "\n".join(braces(part) if isinstance(part, str) else grid(part) for part in q.parts)
    return "\n".join([
        '  <question type="cloze">',
        f"    <name><text>{escape_html(name)}</text></name>",
        f'    <questiontext format="html"><text>{cdata(text)}</text></questiontext>',
        f'    <generalfeedback format="html"><text>{cdata(q.feedback)}</text></generalfeedback>',
        f"    <penalty>{PENALTY}</penalty>",
        f"    <defaultgrade>{max(count, 1)}</defaultgrade>",
        "    <hidden>0</hidden>",
        "  </question>"])


def cdata(html: str) -> str:
    """``html`` in CDATA; a ``]]>`` inside is split across two sections so it cannot end it."""
    return "<![CDATA[" + html.replace("]]>", "]]]]><![CDATA[>") + "]]>"


def braces(html: str) -> str:
    """HTML with ``{`` and ``}`` as entities, so Moodle's cloze parser sees no blank in it."""
    return html.replace("{", "&#123;").replace("}", "&#125;")


def grid(a: Asked) -> str:
    """An asked stage as a table: row and column headers counted from 1, a blank per entry."""
    rows, cols = a.shape
    head = "".join(f'<th scope="col">column {j + 1}</th>' for j in range(cols))
    body = []
    for i, row in enumerate(a.entries):
        cells = "".join(f"<td>{blank(e, a, i, j)}</td>" for j, e in enumerate(row))
        body.append(f'<tr><th scope="row">row {i + 1}</th>{cells}</tr>')
    caption = braces(f"{tex_html(a.symbol)} {text_html(a.title)}")
    return (f'<table class="symattn-grid" border="1" cellpadding="4" style="border-collapse:collapse">'
            f"<caption>{caption}</caption><tr><th></th>{head}</tr>{''.join(body)}</table>")


def blank(e: "Blank | str", a: Asked, i: int, j: int) -> str:
    if not isinstance(e, Blank):
        return braces(tex_html(e))  # −∞: shown, not asked
    feedback = cloze_text(f"row {i + 1}, column {j + 1}: {e.rounded} to {len(e.rounded.partition('.')[2])} places")
    return f"{{1:NUMERICAL:={e.key}:{e.tolerance}#{feedback}}}"


def cloze_text(text: str) -> str:
    """Text inside a cloze blank's feedback, HTML-escaped, with ``{ } # ~ \\`` as entities: Moodle's
    parser stops the feedback at an unescaped ``~`` or ``}``, then decodes entities (and only
    ``\\}``, ``\\#``), so entities keep each character as itself."""
    return "".join(f"&#{ord(c)};" if c in "{}#~\\" else c for c in escape_html(text))
