"""The reports of ``symattn check``: text, Markdown and LaTeX feedback, and a class's summary.

People count from 1: an entry is named ``S[2,1]`` as the worked solution's subscripts do
(JSON keeps 0-based ``row`` and ``col``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from .verdicts import MAX_WRONG_SHOWN, Diagnosis, Marking, StageMark, WrongEntry, entry_name

_RULE_WORDS = {
    "exact": "exact",
    "rounding": "rounded to the places written",
    "float64": "to float64's rounding",
    "float32": "to float32's rounding",
    "tolerance": "within the tolerance",
}


def _approx(w: WrongEntry) -> str:
    """`` ≈ 0.4231`` after an expected value that is not a plain number already, to at least as
    many significant digits as the answer was written with (so the difference shows)."""
    if w.expected_approx is None or re.fullmatch(r"-?[0-9]+", w.expected):
        return ""
    written = len(re.sub(r"^[-+]?0*\.?0*", "", w.given.lower().split("e")[0]).replace(".", ""))
    return f" ≈ {w.expected_approx:.{min(max(6, written + 1), 17)}g}"


def rules_sentence(s: StageMark) -> str:
    """Which rule made the entries right, e.g. ``3 exact, 13 rounded to the places written``."""
    counts = s.rule_counts
    if not counts:
        return ""
    if len(counts) == 1 and "exact" in counts:
        return "every entry exact"
    return ", ".join(f"{n} {_RULE_WORDS[rule]}" for rule, n in counts.items())


def verdict_line(s: StageMark) -> str:
    """A stage's verdict in a line: ``✗ S: 1 wrong entry``, ``✓ A: every entry exact``."""
    line = {"right": "✓", "follows": "✓ (follows)", "wrong": "✗"}[s.status] + f" {s.id}"
    if s.status == "wrong":
        return line + f": {s.wrong_count} wrong " + ("entry" if s.wrong_count == 1 else "entries")
    details = [d for d in (s.note, rules_sentence(s)) if d]
    return line + (": " + "; ".join(details) if details else "")


def detail_lines(s: StageMark, max_wrong: int = MAX_WRONG_SHOWN, more: str = "") -> list[str]:
    """A wrong stage's entries (the first ``max_wrong``, then how many more, with ``more`` after
    that count) and its likely cause, a line each."""
    lines = [f"{entry_name(s.id, w.row, w.col)}: you wrote {w.given}, expected {w.expected}{_approx(w)}"
             for w in s.wrong[:max_wrong]]
    if s.wrong_count > max_wrong:
        lines.append(f"... and {s.wrong_count - max_wrong} more{more}")
    if s.diagnosis:
        lines.append(f"likely cause: {s.diagnosis.text}")
    return lines


def report_text(m: Marking, max_wrong: int = MAX_WRONG_SHOWN) -> str:
    lines = []
    for s in m.stages:
        lines.append(verdict_line(s))
        lines.extend("    " + line for line in detail_lines(s, max_wrong, " (--format json lists every one)"))
    count = {k: sum(s.status == k for s in m.stages) for k in ("right", "follows", "wrong")}
    summary = f"{count['right']} of {len(m.stages)} stages right"
    if count["follows"]:
        summary += f", {count['follows']} right from your own earlier answers"
    if count["wrong"]:
        summary += f", {count['wrong']} wrong"
    lines.append(summary)
    return "\n".join(lines) + "\n"


def report_markdown(m: Marking) -> str:
    from ..render.escape import escape_markdown as escape

    lines = ["| stage | verdict | details |", "|---|---|---|"]
    for s in m.stages:
        verdict = {"right": "✓ right", "follows": "✓ follows", "wrong": "✗ wrong"}[s.status]
        details = [escape(d) for d in (s.note, s.status != "wrong" and rules_sentence(s)) if d]
        for w in s.wrong:
            details.append(f"{escape(entry_name(s.id, w.row, w.col))}: {escape(w.given)} → {escape(w.expected)}{_approx(w)}")
        if s.diagnosis:
            details.append(f"likely cause: {escape(s.diagnosis.text)}")
        lines.append(f"| {escape(s.id)} | {verdict} | {'<br>'.join(details)} |")
    return "\n".join(lines) + "\n"


def report_latex(m: Marking) -> str:
    from ..render.escape import escape_tex

    rows = []
    for s in m.stages:
        details = [escape_tex(d) for d in (s.note, s.status != "wrong" and rules_sentence(s)) if d]
        for w in s.wrong:
            details.append(f"{escape_tex(entry_name(s.id, w.row, w.col))}: {escape_tex(w.given)} $\\to$ "
                           f"\\texttt{{{escape_tex(w.expected)}}}")
        if s.diagnosis:
            details.append("likely cause: " + escape_tex(s.diagnosis.text))
        cell = " \\newline ".join(details) or "--"
        rows.append(f"{escape_tex(s.id)} & {s.status} & {cell} \\\\")
    body = "\n".join(rows)
    return (
        "\\begin{tabular}{l l p{0.6\\linewidth}}\n\\hline\nstage & verdict & details \\\\\n\\hline\n"
        + body
        + "\n\\hline\n\\end{tabular}\n"
    )


# -- a class of answers files -------------------------------------------------------------


@dataclass(frozen=True)
class StageSummary:
    """One stage over a class's answers files: how many right, right by follow-through, wrong,
    and the most common diagnosis of the wrong ones (with how many it was given to)."""

    id: str
    answered: int
    right: int
    follows: int
    wrong: int
    diagnosis: str | None = None
    diagnosis_count: int = 0

    def as_dict(self) -> dict:
        out = {"id": self.id, "answered": self.answered, "right": self.right, "follows": self.follows, "wrong": self.wrong}
        if self.diagnosis:
            out["most_common_diagnosis"] = {"text": self.diagnosis, "count": self.diagnosis_count}
        return out


def class_summary(markings: list[Marking], order: list[str]) -> list[StageSummary]:
    """Per stage (in ``order``), what a class's answers files came to."""
    out = []
    for id in order:
        marks = [s for m in markings for s in m.stages if s.id == id]
        if not marks:
            continue
        causes = Counter(_cause(s.diagnosis) for s in marks if s.status == "wrong" and s.diagnosis)
        top = causes.most_common(1)
        out.append(StageSummary(id, len(marks), sum(s.status == "right" for s in marks),
                                sum(s.status == "follows" for s in marks), sum(s.status == "wrong" for s in marks),
                                top[0][0] if top else None, top[0][1] if top else 0))
    return out


def _cause(d: Diagnosis) -> str:
    """A diagnosis as a class summary counts it: the mistake's name, or the kind of slip."""
    return d.text if d.kind == "mistake" else d.kind


def summary_text(summary: list[StageSummary]) -> str:
    """The class summary as an aligned table."""
    head = ("stage", "right", "follows", "wrong", "most common diagnosis")
    rows = [(s.id, str(s.right), str(s.follows), str(s.wrong),
             f"{s.diagnosis} ({s.diagnosis_count})" if s.diagnosis else "") for s in summary]
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(4)]
    lines = ["  ".join([r[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(r[1:4], widths[1:])] + [r[4]]).rstrip()
             for r in [head, *rows]]
    return "\n".join(lines) + "\n"


def class_text(files: list[tuple[str, Marking | None, str | None]], ids: list[str], summary: list[StageSummary]) -> str:
    """A line per answers file (``name``, its marking or the error that stopped it), the counts,
    then the class stage by stage."""
    def verdicts(m):
        return {s.id: s.status for s in m.stages} if m is not None else {}

    lines = []
    for p, m, e in files:
        if m is None:
            lines.append(f"{p}: ERROR {e}")
            continue
        wrong = [s.id for s in m.stages if s.status == "wrong"]
        follows = [s.id for s in m.stages if s.status == "follows"]
        line = f"{p}: {'all right' if m.passed else 'wrong: ' + ', '.join(wrong) if wrong else 'right with follow-through'}"
        if follows:
            line += f" (follows: {', '.join(follows)})"
        lines.append(line)
    right = {i: sum(verdicts(m).get(i) == "right" for _, m, _ in files) for i in ids}
    answered = {i: sum(i in verdicts(m) for _, m, _ in files) for i in ids}
    lines.append(f"\n{sum(m is not None and m.passed for _, m, _ in files)} of {len(files)} files all right")
    lines.append("right per stage: " + ", ".join(f"{i} {right[i]}/{answered[i]}" for i in ids))
    return "\n".join(lines) + "\n" + "\nThe class, stage by stage:\n" + summary_text(summary)


def class_csv(files: list[tuple[str, Marking | None, str | None]], ids: list[str]) -> str:
    """A row per answers file: whether it passed, each stage's verdict, the error that stopped it."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["file", "passed", *ids, "error"])
    for p, m, e in files:
        v = {s.id: s.status for s in m.stages} if m is not None else {}
        writer.writerow([str(p), "" if m is None else str(m.passed).lower(), *(v.get(i, "") for i in ids), e or ""])
    return buf.getvalue()


def report_html(m: Marking) -> str:
    """A marking as a small HTML table (a notebook shows it): stage, verdict, details."""
    from ..render.escape import escape_html as escape

    rows = []
    for s in m.stages:
        verdict = {"right": "✓ right", "follows": "✓ follows", "wrong": "✗ wrong"}[s.status]
        details = [escape(d) for d in (s.note, s.status != "wrong" and rules_sentence(s)) if d]
        for w in s.wrong[:MAX_WRONG_SHOWN]:
            details.append(f"{escape(entry_name(s.id, w.row, w.col))}: you wrote {escape(w.given)}, "
                           f"expected {escape(w.expected + _approx(w))}")
        if s.wrong_count > MAX_WRONG_SHOWN:
            details.append(f"… and {s.wrong_count - MAX_WRONG_SHOWN} more")
        if s.diagnosis:
            details.append(f"likely cause: {escape(s.diagnosis.text)}")
        rows.append(f"<tr><td>{escape(s.id)}</td><td>{verdict}</td><td>{'<br>'.join(details)}</td></tr>")
    return _table(("stage", "verdict", "details"), rows)


def summary_html(summary: list[StageSummary]) -> str:
    """The class summary as a small HTML table."""
    from ..render.escape import escape_html as escape

    rows = [f"<tr><td>{escape(s.id)}</td><td>{s.right}</td><td>{s.follows}</td><td>{s.wrong}</td>"
            f"<td>{escape(f'{s.diagnosis} ({s.diagnosis_count})') if s.diagnosis else ''}</td></tr>" for s in summary]
    return _table(("stage", "right", "follows", "wrong", "most common diagnosis"), rows)


def _table(head: tuple[str, ...], rows: list[str]) -> str:
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")
