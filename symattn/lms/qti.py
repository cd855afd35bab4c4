"""The qti writer (see :mod:`symattn.lms`): one QTI 1.2 package, ``qti.zip``, in Canvas's own
export format (Canvas Classic Quizzes, Blackboard, D2L read it).

The package holds ``imsmanifest.xml`` and one assessment, a section per variant holding all of
that variant's questions. Each asked entry is one Canvas
``numerical_question`` (the statement repeated, the entry named by row and column, people
counting from 1), its answer a range ``[key - tolerance, key + tolerance]`` (``vargte`` /
``varlte``), the worked solution its feedback.

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

from .question import Asked, Blank, Question, half_unit, text_html

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
    ident = "symattn_assessment"
    files_ = {"imsmanifest.xml": _xml(_manifest(ident, name)),
              f"{ident}/{ident}.xml": _xml(_assessment(questions, ident, name, places))}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files_.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return out.getvalue()


def _xml(root: ET.Element) -> bytes:
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8", xml_declaration=False) + b"\n"


def _manifest(ident: str, name: str) -> ET.Element:
    m = ET.Element("manifest", {"identifier": f"{ident}_manifest",
                                "xmlns": "http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1"})
    meta = ET.SubElement(m, "metadata")
    ET.SubElement(meta, "schema").text = "IMS Content"
    ET.SubElement(meta, "schemaversion").text = "1.1.3"
    ET.SubElement(m, "organizations")
    res = ET.SubElement(ET.SubElement(m, "resources"), "resource",
                        {"identifier": ident, "type": "imsqti_xmlv1p2", "href": f"{ident}/{ident}.xml"})
    ET.SubElement(res, "file", {"href": f"{ident}/{ident}.xml"})
    return m


def _assessment(questions: list[Question], ident: str, name: str, places: int) -> ET.Element:
    root = ET.Element("questestinterop", {"xmlns": "http://www.imsglobal.org/xsd/ims_qtiasiv1p2"})
    a = ET.SubElement(root, "assessment", {"ident": ident, "title": f"{name}: attention exercises"})
    top = ET.SubElement(a, "section", {"ident": "root_section"})
    for q in questions:
        s = ET.SubElement(top, "section", {"ident": f"{ident}_{q.name}", "title": f"{q.title} ({q.name})"})
        n = 0
        for stage in q.asked:
            for b in stage.blanks:
                n += 1
                _item(s, q, stage, b, f"{q.name}_{n:03d}", places)
    return root


def _mattext(parent: ET.Element, html: str) -> None:
    ET.SubElement(ET.SubElement(parent, "material"), "mattext", {"texttype": "text/html"}).text = html


def _ask_html(stage: Asked, b: Blank, places: int) -> str:
    k = scale_of(places)
    what = (f"the entry in row {b.row + 1}, column {b.col + 1} of \\({stage.symbol}\\) "
            f"({text_html(stage.title)})")
    if k:
        what = f"10<sup>{k}</sup> times {what}"
    return f"<p><strong>Give {what}, to {places - k} decimal places.</strong></p>"


def _item(section: ET.Element, q: Question, stage: Asked, b: Blank, ident: str, places: int) -> None:
    item = ET.SubElement(section, "item", {"ident": ident, "title": f"{q.name}: {stage.id} "
                                                                    f"row {b.row + 1}, column {b.col + 1}"})
    md = ET.SubElement(ET.SubElement(item, "itemmetadata"), "qtimetadata")
    for label, entry in (("question_type", "numerical_question"), ("points_possible", "1.0")):
        f = ET.SubElement(md, "qtimetadatafield")
        ET.SubElement(f, "fieldlabel").text = label
        ET.SubElement(f, "fieldentry").text = entry
    pres = ET.SubElement(item, "presentation")
    statement = q.statement(lambda s: f"<p>\\({s.symbol}\\) ({text_html(s.title)}): asked below.</p>")
    _mattext(pres, statement + "\n" + _ask_html(stage, b, places))
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
    _mattext(ET.SubElement(fb, "flow_mat"), q.feedback)
