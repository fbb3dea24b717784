"""Rules and containers for optional libraries, registered once the process has imported them.

Hugging Face Transformers is an optional extra (``privtrain-common[hf]``; PEFT, for LoRA on its models, comes
with the worker) and importing its model modules takes seconds, so the ghost package does not import it: a
model built from Transformers classes can only exist once ``transformers`` is imported, so the engine's entry
points (the support check and the recorder) call `load_optional_families` first, which then imports
`hf_layers` and `hf_containers` (they register themselves). Without Transformers installed, or in a process
that never imported it, nothing happens.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["OPTIONAL_FAMILIES", "load_optional_families"]

OPTIONAL_FAMILIES: dict[str, tuple[str, ...]] = {
    "transformers": (
        "dp.per_example.ghost.hf_layers",
        "dp.per_example.ghost.hf_containers",
        "dp.per_example.ghost.hf_vit",
    ),
    "peft": ("dp.per_example.ghost.peft_containers",),
}
"""Library -> the modules of this package that register its layers and containers."""


def load_optional_families() -> None:
    """Import the registering modules of every optional library this process has imported.

    Cheap when done (a dictionary look-up per library): a module is imported, so registered, once."""
    for library, modules in OPTIONAL_FAMILIES.items():
        if sys.modules.get(library) is not None:  # None: an import of it was blocked
            for module in modules:
                if module not in sys.modules:
                    importlib.import_module(module)
