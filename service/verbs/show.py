"""The ``show`` verb: print rows of one table of the lake, without a JVM.

The rows come from delta-rs (`service.lake.lakeview`): ``--where`` is a DataFusion SQL
predicate over the table's columns, ``--version`` reads an earlier version (Delta
time travel). Rows are printed in the table's column order and in no particular
row order, as a text table, JSON Lines or CSV. One rendering of values serves
every format: binary (Kafka's exact key and value bytes) as lowercase hex,
timestamps as ISO-8601 (``Z`` for UTC), non-finite floats as ``NaN`` /
``Infinity`` / ``-Infinity``, nested values (headers) as compact JSON.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO

from service.lake.lakeview import plain
from service.lake.tables import Table

if TYPE_CHECKING:
    import pyarrow as pa

    from service.lake.lakeview import LakeReader

Format = Literal["table", "json", "csv"]
FORMATS: tuple[Format, ...] = ("table", "json", "csv")
DEFAULT_LIMIT = 20
# A text-table cell longer than this is cut (JSON and CSV are never cut).
CELL_WIDTH = 60


@dataclass(frozen=True)
class ShowRequest:
    """What to print: ``limit`` rows (0 = all) of ``table`` matching ``where``, at ``version``."""

    table: Table
    where: str | None = None
    limit: int = DEFAULT_LIMIT
    version: int | None = None
    output_format: Format = "table"


def sql_name(table: Table) -> str:
    """The name ``table`` has in the SQL statement: the last part of its name."""
    return table.name.rpartition("/")[2]


def select_statement(table: Table, where: str | None, limit: int) -> str:
    """The SQL statement of a request: up to ``limit`` rows (0 = all) matching ``where``."""
    sql = f"SELECT * FROM {sql_name(table)}"  # noqa: S608 - the operator's predicate, read-only
    if where and where.strip():
        sql += f" WHERE ({where})"
    return sql + (f" LIMIT {limit}" if limit > 0 else "")


def show(reader: LakeReader, request: ShowRequest, out: TextIO) -> int:
    """Print the rows ``request`` asks for on ``out``; return how many were printed."""
    # Imported here: the command line reads this module's constants for every verb.
    from service.lake.lakeview import open_sql, read_batches

    delta = reader.open(request.table, request.version)
    # One row more than asked, so that the text table can say whether more match.
    probe = request.limit + 1 if request.limit > 0 and request.output_format == "table" else 0
    statement = select_statement(request.table, request.where, probe or request.limit)
    planned = open_sql({sql_name(request.table): delta}, statement)
    batches = read_batches(planned)
    if request.output_format == "json":
        return write_json_lines(batches, out)
    if request.output_format == "csv":
        return write_csv(planned.schema.names, batches, out)
    rows = [row for batch in batches for row in batch.to_pylist()]
    more = request.limit > 0 and len(rows) > request.limit
    shown = rows[: request.limit] if more else rows
    out.write(render_table(planned.schema.names, shown))
    out.write(_footer(len(shown), more) + "\n")
    return len(shown)


def text_cell(value: Any) -> str:
    """One value as a CSV field (null as empty) and, cut and on one line, a table cell."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def write_json_lines(batches: Iterable[pa.RecordBatch], out: TextIO) -> int:
    """One JSON object per row; return the number of rows."""
    count = 0
    for row in _rows(batches):
        out.write(json.dumps({k: plain(v) for k, v in row.items()}, ensure_ascii=False) + "\n")
        count += 1
    return count


def write_csv(columns: Sequence[str], batches: Iterable[pa.RecordBatch], out: TextIO) -> int:
    """A header line, then one line per row (RFC 4180 quoting); return the number of rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    count = 0
    for row in _rows(batches):
        writer.writerow([text_cell(row[c]) for c in columns])
        count += 1
    return count


def render_table(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """Rows as an aligned text table (null shown as ``null``), cells cut to `CELL_WIDTH`."""
    cells = [[_table_cell(row[c]) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(columns), ["-" * w for w in widths], *cells]
    ]
    return "\n".join(lines) + "\n"


def _table_cell(value: Any) -> str:
    text = "null" if value is None else text_cell(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "…"


def _footer(shown: int, more: bool) -> str:
    noun = "row" if shown == 1 else "rows"
    if more:
        return f"({shown} {noun} shown; more match: --limit N shows N, --limit 0 all)"
    return f"({shown} {noun})"


def _rows(batches: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        yield from batch.to_pylist()
