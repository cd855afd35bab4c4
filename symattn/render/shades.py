"""The greys that shade the attention weights, one scale for the PDF, the web page and its heat map.

A weight w is shaded ``grey(w)`` of white: 1 (white) for 0 down to ``DARKEST`` for 1. The darkest
grey stays light enough that black digits on it keep WCAG AA contrast (at least 4.5:1) and stay
readable on a photocopy: ``DARKEST = 0.65`` gives about 8.6:1 with black. Masked entries are not
shaded: the PDF writes them in ``MASKED_TEXT`` grey on white, the web page hatches them with
``HATCH`` and writes them in ``TEXT``. tests/test_contrast.py computes the contrast of every shade.

>>> grey(0), grey(1), grey(0.5)
(1.0, 0.65, 0.825)
>>> grey_percent(1)
65
"""

from __future__ import annotations

DARKEST = 0.65  # the grey of a weight of 1 (0: black, 1: white)
MASKED_TEXT = 0.35  # the PDF's grey for a masked entry's digits, on white
TEXT = "#1a1a1a"  # the web page's text, and its heat map's
HATCH = ("#fff", "#d0d0d0")  # the web page's hatching of masked entries: its two stripes
HATCH_LINE = "#888"  # the heat map's hatching of masked cells (no digits are written on them)


def grey(weight: float) -> float:
    """The grey of ``weight`` (clamped to 0..1) as a fraction of white."""
    w = max(0.0, min(1.0, float(weight)))
    return 1 - (1 - DARKEST) * w


def grey_percent(weight: float) -> int:
    """The web page's class of a shaded cell: ``g<percent>``, the grey in whole per cent of white."""
    return round(100 * grey(weight))


def on(background: tuple[float, float, float]) -> str:
    """"black" or "white", whichever has the higher WCAG contrast with an sRGB ``background`` (channels
    0..1): at least 4.58:1 on any colour, as the two are equal at a luminance of about 0.18."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    lum = 0.2126 * linear(background[0]) + 0.7152 * linear(background[1]) + 0.0722 * linear(background[2])
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def rgb(level: float) -> str:
    """A grey as CSS ``rgb(…)``."""
    v = round(255 * level)
    return f"rgb({v},{v},{v})"
