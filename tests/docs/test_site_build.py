"""The documentation site builds in strict mode: no broken link or anchor, no page outside the nav."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docs.conftest import REPO_ROOT


def test_mkdocs_strict_build_succeeds(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for page in (
        "index.html",
        "privacy-model/index.html",
        "algorithms/dicesgd/index.html",
        "reference/configuration/index.html",
        "reference/algorithms/index.html",
        "reference/models/index.html",
    ):
        assert (site / page).is_file(), f"{page} missing from the built site"
    assert not (site / "hooks").exists(), "the generator's sources must not be published"
