"""``inferbus._wrap``: a :class:`~inferbus._wrap.FittedTable`'s rows, each added with its ``name=value`` block by
``add_row``, printed as a table where it fits the console and as the blocks where it does not."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from inferbus._wrap import FittedTable


def _printed(fitted: FittedTable, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(fitted)
    return out.getvalue().splitlines()


def _listing() -> FittedTable:
    table = Table()
    for col in ("kind", "device", "max batch", "memory", "served by"):
        table.add_column(col)
    fitted = FittedTable(table, "devices", wrap_cells=True)
    fitted.add_row("gpu", "gpu0", "64", "80 GiB", "tensorrt", head_cells=2)  # the default head and items
    fitted.add_row("cpu", "2 slots", "8", "", "onnxruntime", head_cells=2)  # an empty cell: no item
    fitted.add_row("tpu", "tpu0", "", "", "jax", head="  chip tpu0:", items=["served_by=jax", "note=given"])
    return fitted


def test_add_row_adds_a_table_row_and_its_name_value_block():
    fitted = _listing()
    assert fitted.table.row_count == 3
    assert fitted.blocks == [
        ("gpu gpu0:", ["max_batch=64", "memory=80 GiB", "served_by=tensorrt"]),
        ("cpu 2 slots:", ["max_batch=8", "served_by=onnxruntime"]),
        ("  chip tpu0:", ["served_by=jax", "note=given"])]
    table = Table("name", "versions", "max batch")
    one = FittedTable(table, "models")
    one.add_row("digits", "1,2", "64")  # head_cells 1 by default
    assert one.blocks == [("digits:", ["versions=1,2", "max_batch=64"])]


def test_a_table_that_fits_is_printed_as_the_table():
    lines = _printed(_listing(), 200)
    assert lines[0].strip() == "devices" and lines[1].startswith("┏"), lines
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│ ")]
    assert rows == [["gpu", "gpu0", "64", "80 GiB", "tensorrt"], ["cpu", "2 slots", "8", "", "onnxruntime"],
                    ["tpu", "tpu0", "", "", "jax"]], lines
    assert not any("=" in line for line in lines), lines


def test_a_table_that_does_not_fit_is_printed_as_the_blocks_wrapped_to_the_width():
    lines = _printed(_listing(), 30)
    assert lines == ["devices",
                     "gpu gpu0: max_batch=64",
                     "    memory=80 GiB",
                     "    served_by=tensorrt",
                     "cpu 2 slots: max_batch=8",
                     "    served_by=onnxruntime",
                     "  chip tpu0: served_by=jax",
                     "      note=given"], lines
