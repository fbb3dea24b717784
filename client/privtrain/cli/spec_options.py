"""A job spec from the command line: ``--spec FILE`` and the flags that override its fields,
shared by ``privtrain jobs estimate`` and ``privtrain jobs submit``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from privtrain.specs import SpecFileError, SpecOverrides, load_spec_file, merge_spec, parse_assignment

F = TypeVar("F", bound=Callable[..., Any])

_SPEC_KEY = "privtrain.spec"


def _collect(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Store a spec option in ``ctx.meta`` so estimate and submit share one option set."""
    ctx.meta.setdefault(_SPEC_KEY, {})[param.name] = value
    return value


def _assignments(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, Any]:
    try:
        parsed = dict(parse_assignment(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    _collect(ctx, param, parsed)
    return parsed


def _spec_option(
    *decls: str,
    type: click.ParamType[Any, Any] | type | None = None,
    multiple: bool = False,
    callback: Callable[[click.Context, click.Parameter, Any], Any] = _collect,
    help: str | None = None,
) -> Callable[[F], F]:
    return click.option(*decls, type=type, multiple=multiple, expose_value=False, callback=callback, help=help)


def with_options(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """Apply a shared list of click options (in the order listed in --help)."""

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


SPEC_OPTIONS = [
    _spec_option(
        "--spec",
        "spec_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="job spec as JSON or YAML; the flags below override its fields",
    ),
    _spec_option("--dataset", "dataset_id", help="dataset id"),
    _spec_option("--model", help="model name (see `privtrain models`)"),
    _spec_option(
        "--model-param",
        "model_params",
        multiple=True,
        callback=_assignments,
        help="model parameter key=value (repeatable; values read as JSON)",
    ),
    _spec_option("--algorithm", help="algorithm name (see `privtrain algorithms`)"),
    _spec_option(
        "--hyper",
        "hyperparameters",
        multiple=True,
        callback=_assignments,
        help="hyperparameter key=value (repeatable; values read as JSON)",
    ),
    _spec_option("--target-epsilon", type=float, help="ε to spend; the server calibrates σ"),
    _spec_option("--noise-multiplier", type=float, help="fix σ instead of a target ε"),
    _spec_option("--delta", type=float, help="δ (default: the dataset's)"),
    _spec_option("--epochs", type=float),
    _spec_option("--steps", type=int),
    _spec_option("--batch-size", type=int, help="expected batch size q·n"),
    _spec_option("--lr", "learning_rate", type=float, help="learning rate"),
    _spec_option("--init-job", help="model.init: start from this succeeded job's model"),
    _spec_option("--init-base-model", help="model.init: start from this base model (bm_...)"),
    _spec_option(
        "--finetune",
        type=click.Choice(["full", "head", "last_k_blocks", "lora"]),
        help="with an init: which parameters train (default full)",
    ),
    _spec_option("--finetune-k", type=int, help="k of --finetune last_k_blocks"),
    _spec_option("--lora-rank", type=click.IntRange(1, 256), help="rank of the adapters of --finetune lora"),
    _spec_option("--lora-alpha", type=float, help="alpha of --finetune lora: the update is scaled by alpha/rank"),
    _spec_option(
        "--lora-target",
        "lora_targets",
        multiple=True,
        help="an hf model's layer that gets adapters (repeatable; default: the family's attention projections)",
    ),
    _spec_option(
        "--eval-holdout-fraction",
        type=click.FloatRange(0, 0.5, min_open=True),
        help="DP evaluation: the fraction of rows held out (per-row coin flips) and scored at the end",
    ),
    _spec_option(
        "--eval-mechanism",
        type=click.Choice(["laplace", "gaussian"]),
        help="DP evaluation: how the metric is released (default laplace, with --eval-epsilon)",
    ),
    _spec_option("--eval-epsilon", type=float, help="DP evaluation, laplace: the released metric's pure ε"),
    _spec_option("--eval-noise-multiplier", type=float, help="DP evaluation, gaussian: noise std / sensitivity"),
    _spec_option(
        "--token-loss",
        type=click.Choice(["mean", "sum"]),
        help="language-model datasets: a row's loss is the mean (default) or sum of its token losses",
    ),
    _spec_option(
        "--augmult",
        type=click.IntRange(1, 32),
        help="image datasets: K augmented views (crop, flip) per sampled image, gradients averaged; same ε",
    ),
    _spec_option(
        "--rows-per-unit",
        type=click.IntRange(1, 64),
        help="datasets with a privacy unit column: rows averaged per sampled person before clipping "
        "(default 4); same ε",
    ),
    _spec_option(
        "--precision",
        type=click.Choice(["fp32", "bf16"]),
        help="bf16: mixed precision (faster on GPUs with bf16 tensor cores); norms, clipping, noise stay fp32; same ε",
    ),
    _spec_option(
        "--queue",
        help="the worker queue to run on (one the service offers, e.g. gpu-h100); default: by the model's size",
    ),
]


def spec_from_context(ctx: click.Context) -> dict[str, Any]:
    given = dict(ctx.meta.get(_SPEC_KEY, {}))
    spec_file = given.pop("spec_file", None)
    try:
        base = load_spec_file(spec_file) if spec_file else None
    except SpecFileError as exc:
        raise click.UsageError(str(exc)) from None
    if base is None and not any(v for v in given.values()):
        raise click.UsageError("give a job spec: --spec FILE and/or --dataset, --model, --algorithm, ...")
    return merge_spec(base, SpecOverrides(**{k: v for k, v in given.items() if v is not None}))
