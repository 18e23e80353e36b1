"""Small markdown tables for Dagster metadata and logs. No Dagster here."""

from __future__ import annotations


def markdown_table(columns: list[str], rows: list[tuple]) -> str:
    """A markdown table; floats as ``:g``, NULL as an empty cell."""
    cells = ["" if v is None else (f"{v:g}" if isinstance(v, float) else str(v)) for row in rows for v in row]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    width = len(columns)
    lines += ["| " + " | ".join(cells[i : i + width]) + " |" for i in range(0, len(cells), width)]
    return "\n".join(lines)
