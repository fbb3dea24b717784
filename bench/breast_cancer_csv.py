"""Write scikit-learn's breast-cancer data the way a hospital export looks, for "Preparing your data".

The CSV has a ``patient_id`` text column, the 30 measurements under their own names and a
``diagnosis`` column holding the words ``benign`` / ``malignant``; ``preparation.json`` is the
owner's public declaration: drop the id, scale every measurement to [0, 1] by public bounds.

The bounds are rounded outward from the ranges in the dataset's published description (the UCI
documentation of this benchmark), per measurement: mean and worst share one, the standard error
has its own. With your own data take them from domain knowledge or a public reference, never
from the rows you upload: bounds read off the rows would be an exact function of them.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path
from typing import Any

from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

BOUNDS: dict[str, tuple[float, float]] = {
    # measurement: (upper bound of its mean and worst value, upper bound of its standard error)
    "radius": (40.0, 5.0),
    "texture": (50.0, 5.0),
    "perimeter": (260.0, 25.0),
    "area": (4500.0, 600.0),
    "smoothness": (0.25, 0.05),
    "compactness": (1.2, 0.15),
    "concavity": (1.3, 0.4),
    "concave points": (0.3, 0.06),
    "symmetry": (0.7, 0.08),
    "fractal dimension": (0.25, 0.03),
}
CLASSES = ("benign", "malignant")


def _upper_bound(feature: str) -> float:
    """sklearn's names: "mean radius", "radius error", "worst radius"."""
    measurement = feature.removeprefix("mean ").removeprefix("worst ").removesuffix(" error")
    mean_or_worst, error = BOUNDS[measurement]
    return error if feature.endswith(" error") else mean_or_worst


def preparation() -> dict[str, Any]:
    """The declaration sent with ``preparation=``: public, independent of the rows."""
    names = load_breast_cancer().feature_names
    return {
        "drop": ["patient_id"],
        "scale": {str(name): {"bounds": [0, _upper_bound(str(name))]} for name in names},
    }


def training_csv(*, seed: int = 0) -> bytes:
    """The training split (80 %, stratified) as a hospital-style CSV."""
    data = load_breast_cancer()
    X_train, _, y_train, _ = train_test_split(
        data.data, data.target, test_size=0.2, random_state=seed, stratify=data.target
    )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["patient_id", *map(str, data.feature_names), "diagnosis"])
    for i, (row, target) in enumerate(zip(X_train.tolist(), y_train.tolist(), strict=True)):
        writer.writerow([f"P{i:05d}", *(repr(v) for v in row), str(data.target_names[target])])
    return out.getvalue().encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "breast_cancer.csv").write_bytes(training_csv(seed=args.seed))
    (args.out / "preparation.json").write_text(json.dumps(preparation(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out / 'breast_cancer.csv'} and {args.out / 'preparation.json'}")


if __name__ == "__main__":
    main()
