"""Which published points were used to set a device profile's constants ("fitted") and which were not ("held out").

The rule is mechanical, so nobody chooses the split by hand: a point is fitted on a profile when one of the
documents its source names is also named anywhere in that profile's [sources] (the text behind every constant);
otherwise it is held out. A citation counts whatever the prose around it says ("not used" included): the rule does
not read prose, so it errs towards "fitted".

A document is named by one of these identifiers, found in the text by the patterns below:

- an arXiv paper: ``arXiv:2407.08608``;
- a GitHub issue or pull request: ``owner/repo#N`` (written ``github.com/owner/repo/issues/N``, ``/pull/N`` or
  ``owner/repo#N``);
- a file, by its path as written (``compute/accelerator/README.md``, ``docs/source/performance.md``): a token
  ending in a document extension. Two repositories' files with the same path would count as one document, which
  can only make more points fitted.

One table joins documents that hold the same measurements (``SAME_TABLE``): a file that tabulates a set of issues
stands for every one of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

ARXIV = re.compile(r"arXiv:(\d{4}\.\d{4,5})")
ISSUE = re.compile(r"(?:github\.com/)?\b([A-Za-z0-9][\w.-]*/[\w.-]+?)(?:/issues/|/pull/|#)(\d+)\b")
FILE = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:md|txt|h|py|csv|json|ini|cpp|toml|html|pdf))\b"
)

# A file identifier -> the prefix of the issue identifiers whose rows it tabulates.
SAME_TABLE = {
    # The repository's results table: one row per submitted run, each run an issue of the repository.
    "database.md": "zzc0721/torch-performance-test-data#",
}


def document_ids(text: str) -> set[str]:
    """The documents a source text names (see the module docstring for the patterns)."""
    ids = {f"arXiv:{number}" for number in ARXIV.findall(text)}
    ids |= {f"{repo}#{number}" for repo, number in ISSUE.findall(text)}
    ids |= set(FILE.findall(text))
    return ids


def same_document(point_doc: str, cited_doc: str) -> bool:
    """True when a point's document is the profile's, or a row of the table the profile cites."""
    return point_doc == cited_doc or (cited_doc in SAME_TABLE and point_doc.startswith(SAME_TABLE[cited_doc]))


def fitting_documents(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """Every document a profile's [sources] names -> the constants whose source text names it."""
    cited: dict[str, list[str]] = {}
    for constant, text in sources.items():
        for doc in document_ids(str(text)):
            cited.setdefault(doc, []).append(constant)
    return cited


def split_point(point: Mapping[str, Any], sources: Mapping[str, str]) -> tuple[str, dict[str, list[str]]]:
    """("fitted" or "held-out", the shared documents -> the profile constants citing them) for one point."""
    cited = fitting_documents(sources)
    shared: dict[str, list[str]] = {}
    for doc in sorted(document_ids(point["source"]["document"])):
        hits = sorted(
            {c for cited_doc, constants in cited.items() if same_document(doc, cited_doc) for c in constants}
        )
        if hits:
            shared[doc] = hits
    return ("fitted" if shared else "held-out"), shared


def used_for_fitting(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """device -> document -> constants, over every fitted row: which documents set which constants."""
    used: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        for doc, constants in (row.get("fitted_by") or {}).items():
            entry = used.setdefault(row["device"], {}).setdefault(doc, [])
            entry.extend(c for c in constants if c not in entry)
    return {device: dict(sorted(docs.items())) for device, docs in sorted(used.items())}
