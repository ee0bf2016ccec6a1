"""Output that fits the terminal: lines wrapped between their items (:func:`wrap_items`), and tables that fall back to
``name=value`` blocks where rich would have to cut their cells (:class:`FittedTable`).

Imports rich only (inside the functions): the CLI's listings (``models``, ``nodes``) use it without loading the load
generator."""

from __future__ import annotations

import textwrap


def wrap_items(head: str, items: list[str], width: int, indent: int) -> list[str]:
    """``head`` and then ``items`` as lines of at most ``width`` characters, wrapped between items (never inside one):
    each item follows a space (none after a ``head`` that ends with one), and a line that would run past ``width``
    ends, the next starting with ``indent`` spaces. An item longer than a line is left whole, for the console to
    fold. Used for the results (:func:`~inferbus.loadgen.render_table`), the CLI's listings (:class:`FittedTable`),
    ``up``'s lines and the demo's hop-by-hop means on a narrow terminal."""
    line, lines = head, []
    for item in items:
        if line.strip() and len(line) + 1 + len(item) > width:
            lines.append(line)
            line = " " * indent + item
        else:
            line += item if not line or line.endswith(" ") else " " + item
    lines.append(line)
    return lines


def wrap_words(line: str, width: "int | None", indent: int = 4) -> list[str]:
    """``line`` wrapped between its words to ``width`` characters (:func:`wrap_items`): its first word and then the
    others, each further line indented by ``indent`` more than ``line``; ``[line]`` where it fits or ``width`` is
    None (piped into a log: one line, grepped). A word longer than a line is left whole, for the console to fold.
    Blanks at its end are left out, and runs of blanks between words are one."""
    line = line.rstrip()
    if width is None or len(line) <= width:
        return [line]
    lead = line[:len(line) - len(line.lstrip())]
    first, *words = line.split()
    return wrap_items(lead + first, words, width, len(lead) + indent)


def name_value_items(columns, cells) -> list[str]:
    """``name=value`` items of a table row's ``cells`` under ``columns`` (a column's spaces made ``_``: ``max
    batch`` → ``max_batch=64``), an empty cell left out: a :class:`FittedTable` block's items."""
    return [f"{col.replace(' ', '_')}={cell}" for col, cell in zip(columns, cells) if cell]


def block_lines(head: str, items: list[str], width: int) -> list[str]:
    """One :class:`FittedTable` block: ``head`` then the ``items``, wrapped between items
    (:func:`wrap_items`), each further line indented 4 more than ``head``; an item longer than a line is
    wrapped between its words under the same indent (a word longer than a line is broken)."""
    indent = len(head) - len(head.lstrip()) + 4
    lines = []
    for line in wrap_items(head, items, width, indent):
        if len(line) <= width:
            lines.append(line)
        else:
            lines += textwrap.wrap(line, width, subsequent_indent=" " * indent, break_on_hyphens=False) or [line]
    return lines


class FittedTable:
    """A rich renderable: ``table`` where rich lays it out in the console's width without cutting a cell, else
    ``title`` and then one block of lines per row (:attr:`blocks`, ``(head, items)``: the head, a row's name, and its
    ``name=value`` items, :func:`block_lines`); :meth:`add_row` adds a row and its block. rich fitted a table to a
    narrow terminal by cutting every cell short (``versi…``, ``onnxr…``, ``node-n1-ser…``; an ``up --demo`` step's
    every latency ``0.…``), so nothing in it could be read.

    ``wrap_cells``: the table is shown where its cells may be wrapped between words to fit (the ``models`` listing's
    descriptions); else only where every cell fits on one line (the load run's figures: a table of numbers).
    The title is printed above the table (``title_justify`` ``"center"`` or ``"left"``) with no spaces after it
    (rich padded a centred title to the table's width: ``up --demo > file`` had lines of 130 characters, most of
    them trailing spaces); ``table`` is given without a title, its columns added and no rows: each row is added
    with its block by :meth:`add_row`."""

    def __init__(self, table, title: str, *, wrap_cells: bool = False, title_justify: str = "center"):
        self.table, self.title, self.blocks = table, title, []
        self.wrap_cells, self.title_justify = wrap_cells, title_justify

    def add_row(self, *cells: str, head: str | None = None, items: list[str] | None = None,
                head_cells: int = 1) -> None:
        """Add a row to the table and its block, the ``(head, items)`` printed in its place where the table does not
        fit, to :attr:`blocks`.

        Args:
            cells: the row's cells, one string per column of the table.
            head: the block's head; default the first ``head_cells`` cells joined by spaces, then ``:`` (``digits:``,
                ``gpu gpu0:``).
            items: the block's ``name=value`` items; default :func:`name_value_items` of the cells after the first
                ``head_cells`` under their columns' headers (``versions=1,2``, ``max_batch=64``; an empty cell left
                out). Give ``head`` or ``items`` where the block says the row otherwise (``nodes``' supervisor
                rows, the load run's results).
            head_cells: how many leading cells name the row (1: ``digits``; 2: ``gpu gpu0``).

        Returns:
            None: the table and :attr:`blocks` grow by one row each."""
        self.table.add_row(*cells)
        if head is None:
            head = " ".join(cells[:head_cells]) + ":"
        if items is None:
            columns = [str(col.header) for col in self.table.columns]
            items = name_value_items(columns[head_cells:], cells[head_cells:])
        self.blocks.append((head, items))

    def __rich_console__(self, console, options):
        from rich.cells import cell_len
        from rich.measure import Measurement
        from rich.segment import Segment
        from rich.text import Text

        width = options.max_width
        lines = None
        if Measurement.get(console, options.update_width(100_000), self.table).maximum <= width:
            lines = console.render_lines(self.table, options, pad=False)
        elif self.wrap_cells and Measurement.get(console, options, self.table).minimum <= width:
            lines = console.render_lines(self.table, options, pad=False)
            # rich shrinks the widest columns first and may still cut one below its longest word: fall back then
            if _ellipses(lines) > _ellipses(console.render_lines(self.table, options.update_width(100_000), pad=False)):
                lines = None  # (more "…" than the table at its full width has: cells cut)
        if lines is None:
            yield Text(self.title, style="italic")
            for head, items in self.blocks:
                for line in block_lines(head, items, width):
                    yield Text(line)
            return
        shown = max((Segment.get_line_length(line) for line in lines), default=0)
        pad = max(0, (shown - cell_len(self.title)) // 2) if self.title_justify == "center" else 0
        yield Text(" " * pad + self.title, style="table.title")
        for line in lines:
            yield from line
            yield Segment.line()


def _ellipses(lines) -> int:
    return sum(seg.text.count("…") for line in lines for seg in line)
