"""The paper a LaTeX solution or sheet is set on: A4, or US Letter where the locale uses Letter.

>>> paper_from_locale({"LANG": "en_US.UTF-8"})
'letter'
>>> paper_from_locale({"LANG": "en_US.UTF-8", "LC_PAPER": "de_DE.UTF-8"})
'a4'
>>> paper_from_locale({})
'a4'
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PAPERS = ("a4", "letter")
DEFAULT_PAPER = "a4"  # the library's default, and the command line's where the locale names no Letter region

# The regions whose locales set their paper to US Letter (216 × 279 mm), as the GNU C library's
# locale data does (LC_PAPER height 279, directly or by a copy of en_US): the United States and
# Puerto Rico, Canada, Mexico, the Philippines, and Bolivia, Chile, Colombia, Costa Rica,
# El Salvador, Guatemala, Nicaragua, Panama and Venezuela. Every other region uses A4.
LETTER_REGIONS = frozenset({"US", "PR", "CA", "MX", "PH", "BO", "CL", "CO", "CR", "SV", "GT", "NI", "PA", "VE"})


def paper_from_locale(environ: Mapping[str, str] | None = None) -> str:
    """``'letter'`` when the locale's paper category names a Letter region, else ``'a4'``.

    The category is read as the C library reads it: ``LC_ALL`` when set, else ``LC_PAPER``, else
    ``LANG`` (the first that is set and not empty); its region is what follows ``_`` in a name
    such as ``en_US.UTF-8`` or ``fr_CA@euro``. ``C``, ``POSIX`` and names without a region give A4.
    """
    env = os.environ if environ is None else environ
    name = next((env[k] for k in ("LC_ALL", "LC_PAPER", "LANG") if env.get(k)), "")
    region = name.split(".", 1)[0].split("@", 1)[0].partition("_")[2]
    return "letter" if region.upper() in LETTER_REGIONS else DEFAULT_PAPER


def geometry(paper: str) -> str:
    """The preamble's geometry line: the paper and symattn's 2 cm margins."""
    return f"\\usepackage[{paper}paper,margin=2cm]{{geometry}}\n"
