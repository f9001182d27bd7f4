"""Tables of strings, laid out one way for every table the project prints (the bench's, the
demo's, `minedraft drafters list`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def text_table(rows: Sequence[Sequence[str]], widths: Sequence[int] | None = None, left: int = 1,
               separator: str = "  ") -> list[str]:
    """Rows of cells (a header is just the first row) as lines of aligned columns: the first
    `left` columns flush left, the others flush right (numbers), each `widths[i]` wide
    (default: its widest cell)."""
    if not rows:
        return []
    if widths is None:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [separator.join(cell.ljust(width) if i < left else cell.rjust(width)
                           for i, (cell, width) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def markdown_lines(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown (GitHub) table; cells are not padded."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]
