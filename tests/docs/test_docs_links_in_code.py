"""Every ``docs/<page>.md#anchor`` that code, tests or docs cite names a page and anchor that exist.

Code comments point to the docs pages that state their rules (instead of restating them); a page
renamed or a heading reworded would leave them pointing nowhere. Anchors are computed as the site
and GitHub compute them (pymdownx's GitHub-style slugs, plus explicit ``<a id="…">`` anchors).
"""

from __future__ import annotations

import re
from functools import cache

from pymdownx.slugs import slugify
from reference_pages import GENERATED_PAGES

from tests.docs.conftest import REPO_ROOT
from tests.docs.test_no_outside_citations import repository_files

DOCS_LINK = re.compile(r"\bdocs/((?:[\w-]+/)*[\w-]+\.md)(?:#([\w-]+))?")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+id=\"([^\"]+)\"")
_slug = slugify(case="lower")


@cache
def anchors_of(page: str) -> frozenset[str]:
    """The anchors a docs page defines: one per heading, and every explicit ``<a id>``."""
    anchors: set[str] = set()
    in_code = False
    for line in (REPO_ROOT / "docs" / page).read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        heading = HEADING.match(line)
        if heading:
            anchors.add(_slug(heading.group(1), "-"))
        anchors.update(EXPLICIT_ANCHOR.findall(line))
    return frozenset(anchors)


def test_every_cited_docs_page_and_anchor_exists() -> None:
    broken = []
    for path in repository_files():
        file = REPO_ROOT / path
        if not file.is_file() or path.startswith("docs/"):
            continue  # pages link to each other relatively; the strict site build checks those
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            for page, anchor in DOCS_LINK.findall(line):
                if page in GENERATED_PAGES:
                    continue
                if not (REPO_ROOT / "docs" / page).is_file():
                    broken.append(f"{path}:{number}: no page docs/{page}")
                elif anchor and anchor not in anchors_of(page):
                    broken.append(f"{path}:{number}: docs/{page} has no anchor #{anchor}")
    assert not broken, "\n".join(broken)


def test_anchors_follow_github_slugs() -> None:
    assert "4-raising-a-budget-a-running-total" in anchors_of("privacy-model.md")
    assert "9-the-ledger-a-rényi-privacy-filter" in anchors_of("privacy-model.md")
    assert "budget-units" in anchors_of("algorithms/kl-family.md")
