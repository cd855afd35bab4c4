"""The one exception type symattn raises for anything a user can fix."""

from __future__ import annotations


class SymattnError(Exception):
    """A problem with the user's input, reported as one line.

    The message reads ``FILE:LINE:COL: FIELD: what is wrong`` when the place is
    known; any part that is unknown is left out.

    An entry's field counts from 1, as the worked solution does (``W_Q row 2, column 1``).

    >>> str(SymattnError("'abc' is not a number", file="p.yaml", line=7, col=12, field="W_Q row 2, column 1"))
    "p.yaml:7:12: W_Q row 2, column 1: 'abc' is not a number"
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        col: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.col = col
        self.field = field
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.file is not None:
            where.append(self.file)
            if self.line is not None:
                where.append(str(self.line))
                if self.col is not None:
                    where.append(str(self.col))
        prefix = ":".join(where)
        parts = [p for p in (prefix, self.field) if p]
        return ": ".join(parts + [self.message])

    def __str__(self) -> str:
        return self._format()
