"""Write scikit-learn's digits as a training CSV and a held-out NPZ for the README walkthrough.

Pixels are divided by their public maximum 16 (no data-dependent scaling); the split is 80/20,
stratified, with a fixed seed, so everyone gets the same held-out set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    digits = load_digits()
    X = digits.data / 16.0
    X_train, X_test, y_train, y_test = train_test_split(
        X, digits.target, test_size=0.2, random_state=args.seed, stratify=digits.target
    )
    args.out.mkdir(parents=True, exist_ok=True)
    header = ",".join([f"x{i}" for i in range(X.shape[1])] + ["label"])
    rows = np.column_stack([X_train, y_train])
    np.savetxt(
        args.out / "digits_train.csv",
        rows,
        delimiter=",",
        header=header,
        comments="",
        fmt=["%.4f"] * X.shape[1] + ["%d"],
    )
    np.savez(args.out / "digits_test.npz", X=X_test.astype(np.float32), y=y_test)
    print(
        f"wrote {args.out / 'digits_train.csv'} ({len(y_train)} rows) "
        f"and {args.out / 'digits_test.npz'} ({len(y_test)} rows)"
    )


if __name__ == "__main__":
    main()
