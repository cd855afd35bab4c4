"""JSON output, exactly as the CLI/JSON contract gives it.

The document is written as a stream (:func:`write_json`): a model-sized head's weights and
outputs run to hundreds of megabytes of text, and no more than one row of a matrix is held at
a time. Each stage's entries are written as text by :mod:`.json_entries`.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Callable

from .. import stages as registry
from .json_entries import approx_float, exact_text, printer_of, stage_parts
from .options import RenderOptions
from .rope import rope_json

if TYPE_CHECKING:
    from ..exact.derivation import Derivation


def as_dict(derivation: "Derivation", *, check=None) -> dict:
    """The JSON document as a dict (every entry held at once; :func:`write_json` streams it)."""
    d = derivation
    printer = printer_of(d)
    stages = []
    for step in d.steps:
        head, _, exact, approx, _ = stage_parts(d, step, printer)
        stages.append({**head, "exact": None if exact is None else list(exact), "approx": list(approx)})
        if "tiles" in step.shows:  # the online softmax's recurrence, row by row (rows 0-based)
            from ..exact.evaluation import to_mpf
            from . import tiles

            stages[-1]["recurrence"] = tiles.as_json(
                d, step, exact_text, lambda x: approx_float(to_mpf(x, 30)) if d.can_evaluate else None)
    out = {"title": d.problem.title, "dims": d.dims, "stages": stages}
    out.update(_extras(d))
    if check is not None:
        out["crosscheck"] = check.as_dict()
    return out


def _extras(d: "Derivation") -> dict:
    """The top-level keys only some problems have: ``rope``, ``kv_groups``, ``kv_cache``, ``decode``,
    ``linear``."""
    out = {}
    rope = rope_json(d)
    if rope is not None:  # only with RoPE: every other problem's JSON is as it was
        out["rope"] = rope
    out.update(_sharing_and_decoding(d))
    if d.problem.linear is not None:
        out["linear"] = _linear(d)
    if getattr(d.problem, "mla", None) is not None:
        out["mla"] = _mla(d)
    return out


def _mla(d: Derivation) -> dict:
    """Multi-head latent attention: its widths, whether the absorbed scores equal the assembled ones
    exactly (every entry of each head's S_abs − S is 0), and the numbers cached per token by MLA, by
    MHA of the same heads and widths, and by GQA with each smaller number of groups."""
    c = registry.Context(d.problem)
    m = d.problem.mla
    diffs = [d.step(registry.stage_id(registry.S_ABS_DIFF, h)).exact for h in c.heads]
    rows = registry.mla_cache_table(c)
    ratio = registry.times_smaller(c)
    groups = [g for g in range(m.heads - 1, 0, -1) if m.heads % g == 0]
    return {"heads": m.heads, "d_c": m.d_c, "d_h": m.d_h, "d_R": m.d_R, "d_v": m.d_v,
            "absorbed_equal": all(x == 0 for mat in diffs for x in mat),
            "cache_per_token": {"mla": rows[0][0], "mha": rows[1][0],
                                "gqa": [{"groups": g, "numbers": r[0]} for g, r in zip(groups, rows[2:])]},
            "times_smaller": str(ratio)}


def _linear(d: Derivation) -> dict:
    """Linear attention: its feature map, whether the recurrent form equals the parallel one exactly
    (every entry of each head's O_rec − O is 0), and the numbers its state keeps against the KV cache's
    per token (every head's)."""
    c = registry.Context(d.problem)
    diffs = [d.step(registry.stage_id(registry.O_REC_DIFF, h)).exact for h in c.heads]
    sizes = [(c.at(h).d_k, c.at(h).d_v) for h in c.heads]
    return {"feature": d.problem.linear.feature, "causal": "causal" in d.problem.mask.kinds,
            "forms_equal": all(x == 0 for m in diffs for x in m),
            "state_numbers": sum(k * v + k for k, v in sizes), "kv_cache_per_token": sum(k + v for k, v in sizes)}


def _sharing_and_decoding(d: Derivation) -> dict:
    """With kv_heads, which query heads read which K/V group; with decode, the decoded token; with
    either, the KV cache's size per token (numbers per layer). Nothing for other problems."""
    p = d.problem
    out: dict = {}
    if p.kv_heads:
        out["kv_groups"] = [{"group": g, "heads": heads, "key_id": registry.stage_id(registry.K, heads[0]),
                             "value_id": registry.stage_id(registry.V, heads[0])} for g, heads in registry.kv_groups(p)]
    if p.kv_heads or p.decode:
        out["kv_cache"] = registry.kv_cache_size(p)
    if p.decode:
        diffs = [d.step(registry.stage_id(registry.O_T_DIFF, h)).exact for h in registry.Context(p).heads]
        out["decode"] = {"token": p.decode, "row": p.decode - 1, "label": p.tokens[p.decode - 1],
                         "equals_full_row": all(x == 0 for m in diffs for x in m)}
        if p.mask.kind == "sink-window":  # StreamingLLM's cache: the keys it keeps (0-based rows) and its bound
            out["decode"].update(cached_rows=list(p.mask.cache_rows(p.decode)), max_cached=p.mask.sink + p.mask.window)
    return out


_encode_text = json.encoder.encode_basestring  # a str as JSON (ensure_ascii=False)


def _value(x, level: int) -> str:
    """``x`` as ``json.dumps(..., indent=2)`` writes it at nesting ``level``."""
    return json.dumps(x, indent=2, ensure_ascii=False).replace("\n", "\n" + "  " * level)


def _float(x) -> str:
    if x is None:
        return "null"
    if x != x:
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return float.__repr__(x)


def _floats(row: list, separator: str) -> str:
    """A row of decimals (floats, None for −∞ or a symbol) as JSON writes them, joined."""
    if None not in row and all(map(math.isfinite, row)):
        return separator.join(map(float.__repr__, row))
    return separator.join(map(_float, row))


def _joined(row: list, separator: str) -> str:
    return separator.join(row)


def _texts(row: list, separator: str) -> str:
    return separator.join(map(_encode_text, row))


def _plain_texts(row: list, separator: str) -> str:
    """Texts with nothing to escape (see :mod:`.json_entries`), quoted and joined in one pass."""
    return '"' + ('"' + separator + '"').join(row) + '"'


def _matrix(write, rows, count: int, joined: Callable[[list, str], str], level: int) -> None:
    """A list of ``count`` rows (each a list) as ``json.dumps(..., indent=2)`` writes it at
    nesting ``level``, one row at a time (``joined(row, separator)``: its entries as JSON, joined)."""
    if not count:
        write("[]")
        return
    outer, inner = "\n" + "  " * (level + 1), "\n" + "  " * (level + 2)
    write("[")
    for i, row in enumerate(rows):
        write(("," if i else "") + outer)
        write("[" + inner + joined(row, "," + inner) + outer + "]" if row else "[]")
    write("\n" + "  " * level + "]")


def write_json(derivation: "Derivation", write: Callable[[str], object], *, check=None) -> None:
    """Write the derivation as one JSON object, piece by piece, with ``write`` (a text file's
    ``write``, say). The text is :func:`render_json`'s, which is ``json.dumps(as_dict(...),
    indent=2, ensure_ascii=False)`` and a newline."""
    d = derivation
    if any("tiles" in step.shows for step in d.steps):
        # the online softmax's recurrence: small problems, written whole
        write(json.dumps(as_dict(d, check=check), indent=2, ensure_ascii=False) + "\n")
        return
    printer = printer_of(d)
    write("{\n  \"title\": " + _value(d.problem.title, 1) + ",\n  \"dims\": " + _value(d.dims, 1)
          + ",\n  \"stages\": ")
    steps = d.steps
    if not steps:
        write("[]")
    else:
        write("[")
        for s, step in enumerate(steps):
            head, rows, exact, approx, (plain, approx_texts) = stage_parts(d, step, printer, float_texts=True)
            write(("," if s else "") + "\n    {")
            for key, value in head.items():
                write("\n      " + _encode_text(key) + ": " + _value(value, 3) + ",")
            write('\n      "exact": ')
            if exact is None:
                write("null")
            else:
                _matrix(write, exact, rows, _plain_texts if plain else _texts, 3)
            write(',\n      "approx": ')
            _matrix(write, approx, rows, _joined if approx_texts else _floats, 3)
            write("\n    }")
        write("\n  ]")
    for key, value in _extras(d).items():  # RoPE's settings, shared K/V, decoding: after the stages
        write(",\n  " + _encode_text(key) + ": " + _value(value, 1))
    if check is not None:
        write(',\n  "crosscheck": ' + _value(check.as_dict(), 1))
    write("\n}\n")


def render_json(derivation: "Derivation", *, check=None, digits: int | None = None) -> str:
    """The derivation as one JSON object (``digits`` is accepted and unused: JSON keeps full floats):
    :func:`document` with these options (see :class:`~symattn.RenderOptions`)."""
    return document(derivation, RenderOptions(digits=digits, check=check))


def document(derivation: "Derivation", options: RenderOptions) -> str:
    """The derivation as one JSON object, with ``options.check`` (JSON has no layout: every stage
    in full, full floats)."""
    parts: list[str] = []
    write_json(derivation, parts.append, check=options.check)
    return "".join(parts)
