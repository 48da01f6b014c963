"""The rows of a documented table, for tests that hold the figures docs/ states.

    table_rows(doc, heading) -> [[cell, ...], ...]   the first markdown table after `heading`
"""

from pathlib import Path


def table_rows(doc: Path, heading: str) -> list[list[str]]:
    """The stripped cells of every body row (header and separator left out) of the first
    table after the line `heading` in `doc`. Raises ValueError if `doc` has no `heading`."""
    text = doc.read_text()
    if heading not in text:
        raise ValueError(f"{doc.name} has no {heading!r}")
    rows: list[list[str]] = []
    for line in text.split(heading, 1)[1].splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break  # the end of the first table
    return rows[2:]
