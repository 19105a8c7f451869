"""How dtcli prints a table, for a person at a terminal and for a pipe.

At a terminal the table fits the width: names and paths (weight paths, rules, variable names,
checkpoints) are never broken or cut, since they are what a user copies and greps for; prose
wraps at spaces, and a path in it only after a '/'; other values are cut with an ellipsis; and
when even that does not fit, the columns marked droppable go first. Where a table with prose
still does not fit side by side (doctor's 47-character flag names beside a path at 80 columns),
each row is stacked instead: its other cells whole on one line, its prose wrapped below it;
where even that line does not fit (40 columns), its values lead and its names follow, on the
next line where a name is too long to follow them; a name wider than the terminal itself is the
one name broken, after a '_' or at a space.
Anywhere else (a pipe, a file) the table is plain text, complete, one row a line, with no box
and no colour, so `grep` and `head` see whole rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# A rich box table spends 3 characters per column and 1 more on its borders.
_PER_COLUMN = 3
# A stacked row's prose, under its other cells.
_STACKED_INDENT = "    "


@dataclass(frozen=True)
class Column:
    header: str
    # name: never cut, broken only where it is wider than the terminal (stacked rows);
    # prose: wraps at spaces; value: cut with an ellipsis.
    kind: Literal["name", "prose", "value"] = "value"
    right: bool = False
    drop: int = 0  # > 0: may be dropped at a narrow terminal, the highest first
    styles: dict[str, str] = field(default_factory=dict)  # a cell's text -> its rich style

    def min_width(self, cells: Sequence[str]) -> int:
        """The narrowest this column may be before dtcli drops a droppable column instead:
        names and values whole (a value is cut only when nothing is left to drop), prose down to
        its longest word (a path's longest part between '/')."""
        if self.kind == "prose":
            return max([len(self.header), *(len(p) for c in cells for p in prose_pieces(c))])
        return max([len(self.header), *map(len, cells)])


def prose_pieces(text: str) -> list[str]:
    """What prose may not be broken inside: its words, a path's parts each with its '/'."""
    pieces = []
    for word in text.split():
        parts = word.split("/")
        pieces += [part + "/" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    return pieces


def wrap_prose(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width`: broken at spaces, and a word too long for a line of
    its own (a path) after a '/'; a part longer than `width` has a line of its own, whole."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) <= width:
            line += " " + word
            continue
        if len(word) <= width or "/" not in word:
            lines.append(line)
            line = word
            continue
        first, *parts = prose_pieces(word)  # starts on this line, where its first part fits
        if line and len(line) + 1 + len(first) <= width:
            line += " " + first
        else:
            lines.append(line)
            line = first
        for part in parts:  # each part follows the '/' before it
            if len(line) + len(part) <= width:
                line += part
            else:
                lines.append(line)
                line = part
    lines.append(line)
    return [x for x in lines if x]


def break_name(name: str, width: int) -> list[str]:
    """`name` in lines of at most `width`, for a terminal narrower than it: broken after a '_'
    or at a space (DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION at 40 columns), and a part
    longer than `width` cut with an ellipsis."""
    lines = [""]
    for part in re.findall(r"[^_ ]*(?:_+| +|$)", name):
        if lines[-1] and len(lines[-1]) + len(part.rstrip()) > width:
            lines[-1] = lines[-1].rstrip()
            lines.append("")
        lines[-1] += part
    cut = [line if len(line) <= width else line[: width - 1] + "…" for line in lines]
    return [line.rstrip() for line in cut if line.strip()]


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
    if _narrowest(columns, rows, keep) > console.width and _prose(columns, keep):
        _print_stacked(console, columns, rows, keep, title, caption)
        return
    limits = _value_limits(columns, rows, keep, console.width)
    wraps = _prose_widths(columns, rows, keep, limits, console.width)
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
        cells = ["\n".join(wrap_prose(row[i], wraps[i])) if i in wraps else row[i] for i in keep]
        table.add_row(*(Text(c, style=columns[i].styles.get(c, "")) for c, i in zip(cells, keep)))
    console.print(table)
    if caption:  # below the table, not inside it: it wraps at the terminal's width
        console.print(caption, markup=False, highlight=False, soft_wrap=False)


def _narrowest(columns: Sequence[Column], rows: Sequence[Sequence[str]], keep: list[int]) -> int:
    """The width of the table of columns `keep` at their narrowest forms, box included."""
    return sum(columns[i].min_width([r[i] for r in rows]) + _PER_COLUMN for i in keep) + 1


def _prose(columns: Sequence[Column], keep: list[int]) -> list[int]:
    return [i for i in keep if columns[i].kind == "prose"]


def _fitting(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Indexes of the columns to show at `width`: all, less the droppable ones (highest `drop`
    first) for as long as the columns' narrowest forms do not fit."""
    keep = list(range(len(columns)))
    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop):
        if _narrowest(columns, rows, keep) <= width:
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


def _prose_widths(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    keep: list[int],
    limits: dict[int, int],
    width: int,
) -> dict[int, int]:
    """The width each prose column wraps at: the room the other columns leave, shared, the
    shortest prose whole first. dtcli wraps the prose itself (rich would fold a path mid-word)."""
    prose = _prose(columns, keep)
    room = width - (_PER_COLUMN * len(keep) + 1)
    for i in keep:
        if i not in prose:
            room -= limits.get(i, columns[i].min_width([r[i] for r in rows]))
    natural = {i: max([len(columns[i].header), *(len(r[i]) for r in rows)]) for i in prose}
    widths: dict[int, int] = {}
    for n, i in enumerate(sorted(prose, key=natural.get)):
        least = columns[i].min_width([r[i] for r in rows])
        widths[i] = max(min(natural[i], room // (len(prose) - n)), least)
        room -= widths[i]
    return widths


def _print_stacked(
    console: Any,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    keep: list[int],
    title: str | None,
    caption: str | None,
) -> None:
    """Each row's cells but its prose on one line, whole and aligned; its prose below it,
    indented, wrapped at spaces and after a '/' (see the module docstring). Where that line
    does not fit (doctor's 47-character flag names at 40 columns), the values lead, aligned,
    and the names follow them: on the same line where both fit, else on the next."""
    from rich.text import Text

    prose = _prose(columns, keep)
    heads = [i for i in keep if i not in prose]
    widths = {i: max([len(columns[i].header), *(len(r[i]) for r in rows)]) for i in heads}
    room = max(console.width - len(_STACKED_INDENT), 1)
    if sum(widths.values()) + 2 * (len(heads) - 1) > console.width:
        heads = [i for i in heads if columns[i].kind != "name"] + [
            i for i in heads if columns[i].kind == "name"
        ]

    def say(text: Any) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    if title:
        say(title)
    header = {i: columns[i].header for i in heads}
    for line in _head_lines(header, columns, heads, widths, console.width, style="bold"):
        say(line)
    for i in prose:
        say(Text(_STACKED_INDENT + columns[i].header, style="bold"))
    for row in rows:
        for line in _head_lines({i: row[i] for i in heads}, columns, heads, widths, console.width):
            say(line)
        for i in prose:
            for line in wrap_prose(row[i], room):
                say(_STACKED_INDENT + line)
    if caption:
        console.print(caption, markup=False, highlight=False, soft_wrap=False)


def _head_lines(
    cells: dict[int, str],
    columns: Sequence[Column],
    heads: list[int],
    widths: dict[int, int],
    width: int,
    style: str = "",
) -> list[Any]:
    """A stacked row's cells but its prose (`heads`, in order), aligned in `widths`, in lines of
    at most `width`: a name that does not fit after the values goes on the next line, broken
    where even that line is too narrow for it."""
    from rich.text import Text

    lines = [Text(style=style)]
    for n, i in enumerate(heads):
        text = cells[i]
        if not (columns[i].kind == "name" and i == heads[-1]):  # nothing follows it: no padding
            text = text.rjust(widths[i]) if columns[i].right else text.ljust(widths[i])
        cell_style = columns[i].styles.get(cells[i], "")
        # The line as printed: a value's padding stays in it, before the 2-space gap.
        if n and len(lines[-1].plain) + 2 + len(text.rstrip()) > width:
            for piece in break_name(text.rstrip(), width):
                lines.append(Text(style=style))
                lines[-1].append(piece, style=cell_style)
            continue
        if n:
            lines[-1].append("  ")
        lines[-1].append(text, style=cell_style)
    for line in lines:
        line.rstrip()
    return lines


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
