"""The qti writer (see :mod:`symattn.lms`): one QTI 1.2 package, ``qti.zip``, in Canvas's own
export format (Canvas Classic Quizzes, Blackboard, D2L read it).

The package holds ``imsmanifest.xml`` and one assessment (a quiz) per variant, so that each
student, or each group, is given one variant, as Canvas assigns a quiz to chosen students. A quiz
opens with the variant's statement as a ``text_only_question`` (the given matrices, and which
stages are asked), then asks each entry as one Canvas ``numerical_question`` (the entry named by
row and column, people counting from 1), its answer a range ``[key - tolerance, key + tolerance]``
(``vargte`` / ``varlte``), its feedback the entry's exact value, and the last entry's the worked
solution too.

Canvas stores numbers below 1e-4 as 0. A range's bound smaller than that is moved inwards to 0
or ±0.0001, the nearest value a written answer can take (with at most 4 places every written
answer is 0 or at least 0.0001 in size), so no right answer is lost and no wrong one let in. With
more than 4 places an entry is asked times 10^(places − 4), to 4 places, and the question says so.
"""

from __future__ import annotations

import io
import zipfile
from decimal import Decimal
from xml.etree import ElementTree as ET

from .question import Asked, Blank, Question, half_unit, tex_html, text_html

NAME = "qti.zip"
_CANVAS_SMALL = Decimal("0.0001")  # Canvas stores numbers below this as 0
_MAX_PLACES = 4


def files(count: int) -> list[str]:
    return [NAME]


def write(run, batch) -> None:
    batch.write(NAME, package(run.questions(), run.name, run.places))


def scale_of(places: int) -> int:
    """The power of 10 each entry is asked times (0 up to 4 places)."""
    return max(0, places - _MAX_PLACES)


def answer_range(blank: Blank, places: int) -> tuple[Decimal, Decimal]:
    """The range of right answers for ``blank``, scaled by :func:`scale_of`, its bounds never
    within 1e-4 of 0 unless 0 (see the module's documentation)."""
    k = scale_of(places)
    key, tol = Decimal(blank.key).scaleb(k), Decimal(half_unit(places - k))
    lo, hi = key - tol, key + tol
    if 0 < abs(lo) < _CANVAS_SMALL:
        lo = _CANVAS_SMALL if lo > 0 else Decimal(0)
    if 0 < abs(hi) < _CANVAS_SMALL:
        hi = Decimal(0) if hi > 0 else -_CANVAS_SMALL
    return lo, hi


def package(questions: list[Question], name: str, places: int) -> bytes:
    """The zip's bytes: the same questions give the same bytes (fixed times, no random ids)."""
    files_ = {"imsmanifest.xml": _xml(_manifest([_ident(q) for q in questions]))}
    for q in questions:
        files_[_href(q)] = _xml(_assessment(q, name, places))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files_.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return out.getvalue()


def _ident(q: Question) -> str:
    return f"symattn_{q.name}"


def _href(q: Question) -> str:
    return f"{_ident(q)}/{_ident(q)}.xml"


def _xml(root: ET.Element) -> bytes:
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8", xml_declaration=False) + b"\n"


def _manifest(idents: list[str]) -> ET.Element:
    m = ET.Element("manifest", {"identifier": "symattn_manifest",
                                "xmlns": "http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"})
    meta = ET.SubElement(m, "metadata")
    ET.SubElement(meta, "schema").text = "IMS Content"
    ET.SubElement(meta, "schemaversion").text = "1.1.3"
    ET.SubElement(m, "organizations")
    resources = ET.SubElement(m, "resources")
    for ident in idents:
        res = ET.SubElement(resources, "resource", {"identifier": ident, "type": "imsqti_xmlv1p2",
                                                    "href": f"{ident}/{ident}.xml"})
        ET.SubElement(res, "file", {"href": f"{ident}/{ident}.xml"})
    return m


def _assessment(q: Question, name: str, places: int) -> ET.Element:
    """A variant's quiz: its statement, then a question per asked entry."""
    root = ET.Element("questestinterop", {"xmlns": "http://www.imsglobal.org/xsd/ims_qtiasiv1p2"})
    seed = "" if q.seed is None else f" (seed {q.seed})"
    a = ET.SubElement(root, "assessment", {"ident": _ident(q), "title": f"{name}: {q.title}{seed}"})
    top = ET.SubElement(a, "section", {"ident": "root_section"})
    statement = q.statement(lambda s: f"<p>\\({s.symbol}\\) ({text_html(s.title)}): asked in the questions "
                                      f"below, entry by entry.</p>")
    _question(top, f"{q.name}_000", f"{q.name}: the problem", "text_only_question", statement, 0)
    asked = [(stage, b) for stage in q.asked for b in stage.blanks]
    for n, (stage, b) in enumerate(asked, 1):
        _item(top, q, stage, b, f"{q.name}_{n:03d}", places, solution=n == len(asked))
    return root


def _question(section: ET.Element, ident: str, title: str, kind: str, html: str, points: int) -> ET.Element:
    """An item of Canvas's ``kind`` showing ``html``; its presentation, to add a response to."""
    item = ET.SubElement(section, "item", {"ident": ident, "title": title})
    md = ET.SubElement(ET.SubElement(item, "itemmetadata"), "qtimetadata")
    for label, entry in (("question_type", kind), ("points_possible", f"{points}.0")):
        f = ET.SubElement(md, "qtimetadatafield")
        ET.SubElement(f, "fieldlabel").text = label
        ET.SubElement(f, "fieldentry").text = entry
    pres = ET.SubElement(item, "presentation")
    _mattext(pres, html)
    return item


def _mattext(parent: ET.Element, html: str) -> None:
    ET.SubElement(ET.SubElement(parent, "material"), "mattext", {"texttype": "text/html"}).text = html


def _ask_html(stage: Asked, b: Blank, places: int) -> str:
    k = scale_of(places)
    what = (f"the entry in row {b.row + 1}, column {b.col + 1} of \\({stage.symbol}\\) "
            f"({text_html(stage.title)})")
    if k:
        what = f"10<sup>{k}</sup> times {what}"
    return f"<p><strong>Give {what}, to {places - k} decimal places.</strong></p>"


def _feedback_html(q: Question, stage: Asked, b: Blank, places: int, solution: bool) -> str:
    """An entry's feedback: its exact value and its rounding; the quiz's last entry also holds the
    worked solution (Canvas shows every question's feedback on the one results page)."""
    html = (f"<p>Row {b.row + 1}, column {b.col + 1} of {tex_html(stage.symbol)} is {tex_html(b.tex)}, "
            f"{b.rounded} to {places} decimal places.</p>")
    return html + ("\n<h4>Worked solution</h4>\n" + q.feedback if solution else "")


def _item(section: ET.Element, q: Question, stage: Asked, b: Blank, ident: str, places: int, *,
          solution: bool) -> None:
    item = _question(section, ident, f"{q.name}: {stage.name}, row {b.row + 1}, column {b.col + 1}",
                     "numerical_question", _ask_html(stage, b, places), 1)
    pres = item.find("presentation")
    resp = ET.SubElement(pres, "response_str", {"ident": "response1", "rcardinality": "Single"})
    ET.SubElement(resp, "render_fib", {"fibtype": "Decimal"}).append(ET.Element("response_label", {"ident": "answer1"}))
    rp = ET.SubElement(item, "resprocessing")
    ET.SubElement(ET.SubElement(rp, "outcomes"), "decvar", {"maxvalue": "100", "minvalue": "0",
                                                             "varname": "SCORE", "vartype": "Decimal"})
    cond = ET.SubElement(rp, "respcondition", {"continue": "No"})
    lo, hi = answer_range(b, places)
    var = ET.SubElement(ET.SubElement(cond, "conditionvar"), "and")
    ET.SubElement(var, "vargte", {"respident": "response1"}).text = str(lo)
    ET.SubElement(var, "varlte", {"respident": "response1"}).text = str(hi)
    ET.SubElement(cond, "setvar", {"action": "Set", "varname": "SCORE"}).text = "100"
    ET.SubElement(cond, "displayfeedback", {"feedbacktype": "Response", "linkrefid": "general_fb"})
    fb = ET.SubElement(item, "itemfeedback", {"ident": "general_fb"})
    _mattext(ET.SubElement(fb, "flow_mat"), _feedback_html(q, stage, b, places, solution))
