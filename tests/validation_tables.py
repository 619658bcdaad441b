"""The tables of docs/validation.md, read by their header rows: one walker for every validation test.

A table is a header row, a ``|---|`` rule and its rows; the section heading
above it names it. Each column is known by its header (``COLUMNS``), so a
table may leave out ``function`` (the plain op's table) or ``backends`` (the
FP8 and ring tables), and those fields are then None. A row whose cells do
not match its header, an unknown column or an error that is not a
ValueError or TypeError stops the walk with the line that broke it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "validation.md"
ERRORS = {"ValueError": ValueError, "TypeError": TypeError}
# A header's name -> the field of Row it fills.
COLUMNS = {
    "id": "id",
    "function": "function",
    "argument": "argument",
    "accepted": "accepted",
    "a violation": "violation",
    "error": "error",
    "backends": "backends",
}
REQUIRED = ("id", "argument", "error")


@dataclass(frozen=True)
class Row:
    """One bad call: ``argument`` of ``function`` (None: the section's one op) raises ``error``."""

    section: str  # the heading above the table, without its #s
    id: str
    argument: str
    error: type[Exception]
    function: str | None = None
    backends: str | None = None
    accepted: str = ""
    violation: str = ""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def read_tables(text: str) -> dict[str, list[Row]]:
    """Every table of ``text`` (markdown), its rows by the heading of its section, in order."""
    tables: dict[str, list[Row]] = {}
    lines = text.splitlines()
    section = ""
    n = 0
    while n < len(lines):
        line = lines[n]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        is_header = line.startswith("|") and n + 1 < len(lines) and lines[n + 1].replace(" ", "").startswith("|---")
        if not is_header:
            n += 1
            continue
        header = _cells(line)
        unknown = [name for name in header if name not in COLUMNS]
        missing = [name for name in REQUIRED if name not in header]
        if unknown or missing:
            raise ValueError(f"{DOC.name}, {section!r}: columns {unknown} unknown, {missing} missing: {line}")
        rows = tables.setdefault(section, [])
        n += 2
        while n < len(lines) and lines[n].startswith("|"):
            cells = _cells(lines[n])
            if len(cells) != len(header):
                raise ValueError(f"{DOC.name}, {section!r}: {len(cells)} cells under {len(header)} columns: {lines[n]}")
            fields = {COLUMNS[name]: cell for name, cell in zip(header, cells, strict=True)}
            if fields["error"] not in ERRORS:
                raise ValueError(f"{DOC.name}, {section!r}: error {fields['error']!r} is not one of {list(ERRORS)}")
            rows.append(Row(section=section, **{**fields, "error": ERRORS[fields["error"]]}))
            n += 1
    return tables


def table(section: str) -> list[Row]:
    """The rows of the table under the heading ``section`` of docs/validation.md ([] if there is none)."""
    return read_tables(DOC.read_text()).get(section, [])


def refused(row: Row):
    """What a row's bad call must raise: its error, naming its argument in the package's one message form."""
    import pytest

    return pytest.raises(row.error, match=rf"^Invalid {re.escape(row.argument)}: expected .+, got .+")
