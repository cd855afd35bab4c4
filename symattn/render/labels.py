"""Which heat-map labels are turned: a short token stays upright, a longer one may be rotated.

Turned 45°, a one-letter token such as "I" reads as a slash, and "a" or "to" lose their shape; a
label of at most ``UPRIGHT_MAX`` characters fits a heat map's column upright, so it stays upright
in every heat map symattn draws (the web page's and ``--plot``'s).

>>> upright("I"), upright("cat"), upright("down")
(True, True, False)
"""

from __future__ import annotations

UPRIGHT_MAX = 3  # characters


def upright(label: str) -> bool:
    """Whether a column label is drawn upright (else it may be rotated to fit)."""
    return len(label) <= UPRIGHT_MAX
