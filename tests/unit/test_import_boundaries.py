"""The package boundaries: the worker loads no web framework, the API loads no torch; only api/
imports a web framework; and kernel/ and api/ import none of the worker's packages nor torch (the
API image must run without the worker's code)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WEB_FRAMEWORKS = ("fastapi", "starlette")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_worker_runner_loads_no_web_framework() -> None:
    loaded = json.loads(
        _run(
            "import json, sys, worker.runner; "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {WEB_FRAMEWORKS!r})))"
        )
    )
    assert loaded == [], f"worker.runner pulls in {loaded[:5]}"


_BLOCK_TORCH = """
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked: {name}")
        return None

sys.meta_path.insert(0, _NoTorch())
"""


def test_the_api_imports_and_builds_without_torch(tmp_path: Path) -> None:
    out = _run(
        _BLOCK_TORCH
        + f"""
from api.main import create_app
from tests.conftest import RecordingDispatcher, make_settings
app = create_app(make_settings({str(tmp_path)!r}), dispatcher=RecordingDispatcher())
print("torch" in sys.modules, len(app.routes) > 0)
"""
    )
    assert out == "False True"


def test_the_torch_blocker_does_block_torch() -> None:
    """The check above would pass vacuously if the finder did not stop torch."""
    assert (
        _run(
            _BLOCK_TORCH
            + """
try:
    import torch  # noqa: F401
except ImportError:
    print("blocked")
"""
        )
        == "blocked"
    )


def _imported_modules(tree: ast.AST) -> set[str]:
    """Every module an import statement names, at module level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


WORKER_SIDE = ("torch", "dp", "training", "worker")
"""What the torch-free packages never import: torch and the packages built on it."""
SERVER_PACKAGES = ("kernel", "api", "admin", "algorithms", "dp", "training", "worker")


def _modules_of(*folders: Path) -> list[Path]:
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


def _importing(paths: list[Path], roots: tuple[str, ...]) -> dict[str, list[str]]:
    """Each file that imports a module under ``roots`` (anywhere in it), with those modules."""
    found = {
        str(path.relative_to(REPO)): sorted(
            name
            for name in _imported_modules(ast.parse(path.read_text(), filename=str(path)))
            if name.split(".")[0] in roots
        )
        for path in paths
    }
    return {path: names for path, names in found.items() if names}


def test_kernel_and_api_import_nothing_of_the_worker_side() -> None:
    paths = _modules_of(REPO / "kernel", REPO / "api")
    assert len(paths) > 150
    assert _importing(paths, WORKER_SIDE) == {}


def test_only_the_api_imports_a_web_framework() -> None:
    outside_api = [
        *_modules_of(*(REPO / package for package in SERVER_PACKAGES if package != "api")),
        *_modules_of(REPO / "client" / "privtrain", REPO / "common" / "privtrain_common"),
    ]
    assert _importing(outside_api, WEB_FRAMEWORKS) == {}
    assert _importing(_modules_of(REPO / "api"), WEB_FRAMEWORKS), "the scan finds the API's own imports"


def test_the_import_scan_sees_lazy_imports() -> None:
    """The scan above would pass vacuously if it missed imports inside functions."""
    tree = ast.parse("def serve():\n    from worker.parent_watch import x\n    import worker.tasks\n")
    assert _imported_modules(tree) == {"worker.parent_watch", "worker.tasks"}


FIRST_PARTY = (*SERVER_PACKAGES, "privtrain", "privtrain_common")
MAY_IMPORT: dict[str, set[str]] = {
    "privtrain_common": set(),
    "kernel": {"privtrain_common", "algorithms"},  # algorithms: its torch-free definitions only
    "api": {"kernel", "privtrain_common", "algorithms"},
    "algorithms": {"kernel", "dp", "training", "privtrain_common"},
    "training": {"kernel", "dp", "privtrain_common"},
    "dp": {"kernel", "privtrain_common"},
    "worker": {"kernel", "algorithms", "dp", "training", "privtrain_common"},
    "admin": {"api", "kernel", "worker", "privtrain_common"},
}
"""The house's rules (docs/development.md#the-house): which first-party packages each may import."""


def _package_folder(package: str) -> Path:
    return REPO / "common" / package if package == "privtrain_common" else REPO / package


def test_every_package_imports_only_what_the_house_allows() -> None:
    broken = {}
    for package, allowed in MAY_IMPORT.items():
        paths = _modules_of(_package_folder(package))
        assert paths, package
        forbidden = tuple(other for other in FIRST_PARTY if other != package and other not in allowed)
        broken.update(_importing(paths, forbidden))
    assert broken == {}


def test_the_torch_free_catalogue_is_all_the_kernel_takes_from_algorithms() -> None:
    """The kernel prices jobs with the definitions; a trainer would bring torch."""
    taken = _importing(_modules_of(REPO / "kernel", REPO / "api"), ("algorithms",))
    assert taken, "the scan sees the kernel's catalogue imports"
    trainers = {path: names for path, names in taken.items() if any("trainer" in name for name in names)}
    assert trainers == {}
