"""How dtcli prints a table, for a person at a terminal and for a pipe.

At a terminal the table fits the width: names and paths (weight paths, rules, variable names,
checkpoints) are never broken or cut, since they are what a user copies and greps for; prose
wraps at spaces; other values are cut with an ellipsis; and when even that does not fit, the
columns marked droppable go first. Anywhere else (a pipe, a file) the table is plain text,
complete, one row a line, with no box and no colour, so `grep` and `head` see whole rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# A rich box table spends 3 characters per column and 1 more on its borders.
_PER_COLUMN = 3


@dataclass(frozen=True)
class Column:
    header: str
    # name: never broken or cut; prose: wraps at spaces; value: cut with an ellipsis.
    kind: Literal["name", "prose", "value"] = "value"
    right: bool = False
    drop: int = 0  # > 0: may be dropped at a narrow terminal, the highest first
    styles: dict[str, str] = field(default_factory=dict)  # a cell's text -> its rich style

    def min_width(self, cells: Sequence[str]) -> int:
        """The narrowest this column may be before dtcli drops a droppable column instead:
        names and values whole (a value is cut only when nothing is left to drop), prose down to
        its longest word."""
        if self.kind == "prose":
            return max([len(self.header), *(len(w) for c in cells for w in c.split())])
        return max([len(self.header), *map(len, cells)])


def print_table(
    console: Any,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    title: str | None = None,
    caption: str | None = None,
) -> None:
    """Print `rows` (plain strings, one per column) as described in the module docstring."""
    if not console.is_terminal:
        _print_plain(console, columns, rows, title, caption)
        return
    from rich.table import Table
    from rich.text import Text

    keep = _fitting(columns, rows, console.width)
    limits = _value_limits(columns, rows, keep, console.width)
    table = Table(title=title, title_justify="left")
    for i in keep:
        c = columns[i]
        table.add_column(
            c.header,
            justify="right" if c.right else "left",
            no_wrap=c.kind != "prose",
            overflow="fold" if c.kind == "prose" else "ellipsis",
            min_width=c.min_width([r[i] for r in rows]) if c.kind == "name" else None,
            max_width=limits.get(i),
        )
    for row in rows:
        table.add_row(*(Text(row[i], style=columns[i].styles.get(row[i], "")) for i in keep))
    console.print(table)
    if caption:  # below the table, not inside it: it wraps at the terminal's width
        console.print(caption, markup=False, highlight=False, soft_wrap=False)


def _fitting(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Indexes of the columns to show at `width`: all, less the droppable ones (highest `drop`
    first) for as long as the columns' narrowest forms do not fit."""
    keep = list(range(len(columns)))
    mins = [c.min_width([r[i] for r in rows]) for i, c in enumerate(columns)]

    def needed() -> int:
        return sum(mins[i] + _PER_COLUMN for i in keep) + 1

    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop):
        if needed() <= width:
            break
        keep.remove(i)
    return keep


def _value_limits(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], keep: list[int], width: int
) -> dict[int, int]:
    """Widths for the value columns where all of them whole do not fit beside the names and the
    prose's longest words: the room left is shared, the narrowest values kept whole first."""
    values = [i for i in keep if columns[i].kind == "value"]
    others = [columns[i].min_width([r[i] for r in rows]) for i in keep if i not in values]
    room = width - (_PER_COLUMN * len(keep) + 1) - sum(others)
    natural = {i: columns[i].min_width([r[i] for r in rows]) for i in values}
    limits: dict[int, int] = {}
    for n, i in enumerate(sorted(values, key=natural.get)):
        share = max(room // (len(values) - n), 2)  # a character and the ellipsis at least
        if natural[i] > share:
            limits[i] = share
        room -= min(natural[i], share)
    return limits


def _print_plain(
    console: Any,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    title: str | None,
    caption: str | None,
) -> None:
    widths = [max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(w) if c.right else cell.ljust(w)
            for cell, w, c in zip(cells, widths, columns)
        ]
        return "  ".join(parts).rstrip()

    out = ([title] if title else []) + [line([c.header for c in columns])]
    out += [line(r) for r in rows] + ([caption] if caption else [])
    for text in out:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
