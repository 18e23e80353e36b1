"""Small markdown tables for Dagster metadata and logs. No Dagster here."""

from __future__ import annotations


def markdown_cell(value: object) -> str:
    """One cell's text: anyone who can name a W&B run writes into these tables, so ``|`` and line breaks (which
    would break the table) and ``<``/``>``/``&`` (HTML) are escaped; floats as ``:g``, NULL as empty."""
    if value is None:
        return ""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return " ".join(text.splitlines())


def markdown_table(columns: list[str], rows: list[tuple]) -> str:
    """A markdown table; floats as ``:g``, NULL as an empty cell, every cell escaped (``markdown_cell``)."""
    cells = [markdown_cell(v) for row in rows for v in row]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    width = len(columns)
    lines += ["| " + " | ".join(cells[i : i + width]) + " |" for i in range(0, len(cells), width)]
    return "\n".join(lines)
