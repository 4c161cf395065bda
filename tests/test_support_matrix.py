"""docs/support.md says what runs: every capability tried on a tiny model of each family, the page made from it."""

from __future__ import annotations

from tests.support_matrix import ROOT, markdown, matrix


def _verdicts(page: str) -> list[list[str]]:
    """Each table row's cells, a "no: why" cut to "no" (the why's wording may move with transformers)."""
    rows = [
        line.strip("|").split(" | ")
        for line in page.splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    return [
        [cell.strip().split(":")[0] if cell.strip().startswith("no:") else cell.strip() for cell in row]
        for row in rows
    ]


def test_the_support_page_says_what_runs():
    table = matrix()
    defects = [
        (family, column, answer)
        for family, cells in table.items()
        for column, answer in cells.items()
        if answer.startswith("DEFECT")
    ]
    assert not defects, f"castcore failed where it should have said why: {defects}"
    fresh = markdown(table)
    page = (ROOT / "docs" / "support.md").read_text(encoding="utf-8")
    assert _verdicts(page) == _verdicts(fresh), (
        "docs/support.md is out of date: python -m tests.support_matrix > docs/support.md\n" + fresh
    )
