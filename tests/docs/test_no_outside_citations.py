"""Code and docs point to the repository's own docs/ pages, never to notes kept outside it."""

from __future__ import annotations

import re
import subprocess

from tests.docs.conftest import REPO_ROOT

SCANNED_DIRS = (
    "kernel",
    "api",
    "admin",
    "algorithms",
    "dp",
    "training",
    "worker",
    "common",
    "client",
    "bench",
    "tests",
    "docs",
)
# Assembled from pieces so that this file does not match its own patterns.
OUTSIDE_CITATION = re.compile(
    "|".join(
        (
            r"(?<![\w-])privacy" + r"\.md",  # the outside rules page (docs/privacy-model.md is ours)
            r"(?<![\w-])specs" + "/",  # the outside per-algorithm specs
            r"(?<![\w-])design" + r"\.md",
            r"\.\./" + "shared",
            # Section and item labels of those notes: the word spec, then a section sign and a digit or a
            # capital letter and a digit (§3.2, A9, T7). A job spec is never followed by either.
            r"(?<![\w-])[Ss]pec" + r" §\d",
            r"(?<![\w-])[Ss]pec" + r" [A-Z]\d",
        )
    )
)


def repository_files() -> list[str]:
    """Tracked files plus new ones not yet committed (ignored build output excluded)."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *SCANNED_DIRS, "README.md"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return sorted({path for path in listing if path.endswith((".py", ".md"))})


def test_no_file_cites_notes_outside_the_repository() -> None:
    files = repository_files()
    assert "README.md" in files and "docs/privacy-model.md" in files
    offenders = []
    for path in files:
        file = REPO_ROOT / path
        if not file.is_file():
            continue  # deleted in the working tree, not yet committed
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if OUTSIDE_CITATION.search(line):
                offenders.append(f"{path}:{number}: {line.strip()}")
    assert not offenders, "cite the repo's docs/ pages instead:\n" + "\n".join(offenders)


def test_the_pattern_catches_each_kind_of_citation() -> None:
    for text in (
        "see privacy" + ".md §2",
        "(specs" + "/dicesgd.md §3.7)",
        "design" + ".md",
        "../" + "shared/papers",
        "never hard-coded (spec" + " §3.2)",
        "Spec" + " §7.5 at CI size",
        "(spec" + " A9)",
        "Spec" + " T7: D = {a, b}",
        "(spec" + " U1–U4)",
    ):
        assert OUTSIDE_CITATION.search(text), text
    for text in (
        "docs/privacy-model.md#1-the-unit-and-the-neighbouring-relation",
        "docs/privacy-model.md §2",
        "def plan(spec: JobCreate)",
        "this spec's own curve",
        "request_hash(spec)",
        "TrainingSpec §2",
        "the paper's §6.2 settings",
        "job spec A or B",
    ):
        assert not OUTSIDE_CITATION.search(text), text
