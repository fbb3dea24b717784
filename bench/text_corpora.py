"""Real text that ships offline, split into JSON Lines datasets for the text benchmarks.

Why: the text benchmarks need real language, and nothing can be downloaded at run time. Three
sources are on every machine that runs this project:

- ``licenses``: the licence texts under /usr/share/common-licenses (Debian's base-files);
- ``vim``: Vim's help files under /usr/share/vim/vim*/doc (when Vim's runtime is installed);
- ``python``: the docstrings of the Python standard library's modules, classes and functions.

Each source is cut into paragraphs (blank-line separated, whitespace collapsed, 80-1000
characters). Two tasks are written:

- classification (``{"text", "label"}``, label = the source): a stratified split into a PUBLIC
  part (for pretraining a base model), a PRIVATE part (the dataset that gets a budget) and a TEST
  part (held out, scored outside the service);
- language modelling (``{"text"}``): the ``python`` paragraphs are the PUBLIC pretraining corpus,
  the ``vim`` paragraphs are split into PRIVATE and TEST.

    .venv/bin/python -m bench.text_corpora --out /tmp/text
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pkgutil
import random
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

MIN_CHARS, MAX_CHARS = 80, 1000
STDLIB_SKIP = (
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "venv",
    "__main__",
    "antigravity",
    "this",
)


def paragraphs(text: str) -> Iterator[str]:
    """Blank-line separated chunks, whitespace collapsed, kept when 80-1000 characters long."""
    for chunk in re.split(r"\n\s*\n", text):
        flat = " ".join(chunk.split())
        if MIN_CHARS <= len(flat) <= MAX_CHARS:
            yield flat


def licence_paragraphs() -> list[str]:
    root = Path("/usr/share/common-licenses")
    return [
        p for path in sorted(root.iterdir()) if path.is_file() for p in paragraphs(path.read_text(errors="replace"))
    ]


def vim_paragraphs() -> list[str]:
    docs = sorted(Path("/usr/share/vim").glob("vim*/doc/*.txt"))
    return [p for path in docs for p in paragraphs(path.read_text(errors="replace"))]


def python_paragraphs() -> list[str]:
    """Docstrings of the standard library (modules importable without side effects)."""
    found: list[str] = []
    names = sorted(m.name for m in pkgutil.iter_modules() if m.name in sys.stdlib_module_names)
    for name in names:
        if name.startswith("_") or name in STDLIB_SKIP:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that cannot be imported here is skipped
            continue
        docs = [inspect.getdoc(module) or ""]
        for _member, obj in inspect.getmembers(module, lambda o: inspect.isclass(o) or inspect.isfunction(o)):
            if getattr(obj, "__module__", None) == name:
                docs.append(inspect.getdoc(obj) or "")
        found.extend(p for doc in docs for p in paragraphs(doc))
    return sorted(set(found))


def write_jsonl(path: Path, records: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def split(items: list[str], fractions: tuple[float, ...], rng: random.Random) -> list[list[str]]:
    shuffled = items[:]
    rng.shuffle(shuffled)
    cuts, start, parts = [], 0, []
    for fraction in fractions[:-1]:
        start += round(fraction * len(shuffled))
        cuts.append(start)
    for begin, end in zip([0, *cuts], [*cuts, len(shuffled)], strict=True):
        parts.append(shuffled[begin:end])
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/out/text"))
    parser.add_argument("--per-class", type=int, default=600, help="paragraphs per source in the classification task")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    sources = {"licenses": licence_paragraphs(), "vim": vim_paragraphs(), "python": python_paragraphs()}
    for name, found in sources.items():
        print(f"{name}: {len(found)} paragraphs")
    usable = {name: found for name, found in sources.items() if found}
    per_class = min(args.per_class, *(len(found) for found in usable.values()))
    public: list[dict[str, str]] = []
    private: list[dict[str, str]] = []
    test: list[dict[str, str]] = []
    for label, found in usable.items():
        chosen = rng.sample(found, per_class)
        for part, into in zip(split(chosen, (0.3, 0.5, 0.2), rng), (public, private, test), strict=True):
            into.extend({"text": text, "label": label} for text in part)
    for name, records in (("cls_public", public), ("cls_private", private), ("cls_test", test)):
        rng.shuffle(records)
        write_jsonl(args.out / f"{name}.jsonl", records)
        print(f"wrote {args.out / name}.jsonl ({len(records)} rows)")
    lm_private, lm_test = split(sources["vim"], (0.9, 0.1), rng)
    for name, texts in (("lm_public", sources["python"]), ("lm_private", lm_private), ("lm_test", lm_test)):
        write_jsonl(args.out / f"{name}.jsonl", [{"text": text} for text in texts])
        print(f"wrote {args.out / name}.jsonl ({len(texts)} rows)")


if __name__ == "__main__":
    main()
