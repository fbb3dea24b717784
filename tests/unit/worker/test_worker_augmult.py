"""Augmentation multiplicity (``training.augmult``): the views, their draws, and the clipped sum.

The views are exact crops and flips of the zero-padded image, drawn from the job's keyed
sub-stream (reproducible, and the main stream untouched). Both per-sample engines give the same
sum, which is Σ_i clip((1/K) Σ_k ∇ℓ(view_ik)) computed by brute force, and each row's
contribution stays within the clipping norm whatever K is.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dp.data.augment import ViewDraws, augmented_views, default_padding, draw_views
from dp.loop.augmult import AugmentedViews, AugmultAggregator, forward_views, with_augmult
from dp.loop.batch_loop import DPSGDConfig, PerSampleMapAggregator, train_dp_sgd
from dp.loop.state import TrainingHooks, TrainingState
from dp.losses import get_loss, mean_over_views
from dp.per_example.ghost import GhostClipAggregator, ghost_clipped_grad_sum
from dp.per_example.per_sample import AbadiClip, clipped_grad_sum
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model

VIEWS = 3

# (id, model name, params, input_shape (C, H, W), n_outputs): the zoo at its smallest.
TINY = [
    ("cnn", "cnn", {"channels": [4, 8], "groups": 2, "activation": "tanh", "pooling": "avg"}, (3, 8, 8), 3),
    ("resnet-gn", "resnet-gn", {"blocks": [1, 1], "width": 4, "groups": 2}, (3, 8, 8), 3),
    ("wrn", "wrn", {"depth": 10, "width": 1, "groups": 4, "weight_standardisation": True}, (3, 8, 8), 3),
    ("vit", "vit", {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 12}, (3, 8, 8), 3),
]


def _tiny(case: tuple, *, n: int = 5, seed: int = 7) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    _, name, params, input_shape, n_outputs = case
    gen = torch.Generator().manual_seed(seed)
    model = build_model(name, params, input_shape=input_shape, n_outputs=n_outputs, generator=gen).double()
    X = torch.rand(n, *input_shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, n_outputs, (n,), generator=gen)
    return model, X, y


# ----------------------------------------------------------------------------- the views


def test_default_padding_is_an_eighth_of_the_shorter_side() -> None:
    assert [default_padding(s, s) for s in (32, 28, 16, 8, 4)] == [4, 3, 2, 1, 1]
    assert default_padding(32, 8) == 1


def test_a_view_is_the_crop_of_the_padded_image_mirrored_where_drawn() -> None:
    image = torch.arange(1, 2 * 5 * 6 + 1, dtype=torch.float32).reshape(1, 2, 5, 6)  # all values distinct, > 0
    padding = 2
    draws = ViewDraws(
        top=torch.tensor([[0, 2, 4, 1]]),
        left=torch.tensor([[3, 2, 0, 4]]),
        flip=torch.tensor([[False, False, True, True]]),
    )
    views = augmented_views(image, draws, padding=padding)
    assert views.shape == (1, 4, 2, 5, 6) and views.dtype == image.dtype
    padded = F.pad(image, (padding,) * 4)
    for k in range(4):
        top, left = int(draws.top[0, k]), int(draws.left[0, k])
        expected = padded[0, :, top : top + 5, left : left + 6]
        if bool(draws.flip[0, k]):
            expected = expected.flip(-1)
        assert torch.equal(views[0, k], expected), k
    assert torch.equal(views[0, 1], image[0])  # centred, not flipped: the image itself
    # Down by 2, left by 1: rows and the last column of the view come from the zero padding.
    assert torch.equal(views[0, 0, :, 2:, :5], image[0, :, :3, 1:])
    assert not bool(views[0, 0, :, :2].any()) and not bool(views[0, 0, :, :, 5].any())


def test_views_keep_the_shape_and_only_the_images_values_or_zero() -> None:
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(6, 3, 8, 8, generator=gen)
    draws = draw_views(images=6, views=5, padding=1, generator=SecureRandom.from_seed(1), step=0, device=images.device)
    views = augmented_views(images, draws, padding=1)
    assert views.shape == (6, 5, 3, 8, 8)
    for i in range(6):
        allowed = torch.cat([images[i].flatten(), torch.zeros(1)])
        assert bool(torch.isin(views[i], allowed).all())
        # A crop shifted by at most one pixel keeps the centre 6×6 of the image (mirrored or not).
        for k in range(5):
            view = views[i, k].flip(-1) if bool(draws.flip[i, k]) else views[i, k]
            dy, dx = int(draws.top[i, k]) - 1, int(draws.left[i, k]) - 1
            assert torch.equal(view[:, 1 - dy : 7 - dy, 1 - dx : 7 - dx], images[i, :, 1:7, 1:7])


def test_draws_are_reproducible_cover_every_choice_and_leave_the_main_stream_alone() -> None:
    first, second = SecureRandom.from_seed(5), SecureRandom.from_seed(5)
    a = draw_views(images=200, views=4, padding=2, generator=first, step=3, device=torch.device("cpu"))
    b = draw_views(images=200, views=4, padding=2, generator=second, step=3, device=torch.device("cpu"))
    assert torch.equal(a.top, b.top) and torch.equal(a.left, b.left) and torch.equal(a.flip, b.flip)
    other = draw_views(images=200, views=4, padding=2, generator=first, step=4, device=torch.device("cpu"))
    assert not torch.equal(a.top, other.top)
    assert set(a.top.unique().tolist()) == set(range(5)) == set(a.left.unique().tolist())
    assert 0.4 < float(a.flip.double().mean()) < 0.6
    assert torch.equal(first.get_state(), SecureRandom.from_seed(5).get_state())  # keyed: no main-stream draw
    another_job = draw_views(
        images=200, views=4, padding=2, generator=SecureRandom.from_seed(6), step=3, device=torch.device("cpu")
    )
    assert not torch.equal(a.top, another_job.top)


# ----------------------------------------------------------------------------- the loss


def test_the_views_loss_is_the_mean_over_views_of_the_base_loss() -> None:
    gen = torch.Generator().manual_seed(1)
    outputs = torch.randn(4, VIEWS, 5, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 5, (4,), generator=gen)
    averaged = get_loss(mean_over_views("cross_entropy")).fn(outputs, targets)
    by_hand = sum(F.cross_entropy(outputs[:, k], targets, reduction="sum") for k in range(VIEWS)) / VIEWS
    torch.testing.assert_close(averaged, by_hand)
    with pytest.raises(ValueError, match="unknown loss"):
        mean_over_views("hinge")


# ----------------------------------------------------------------------------- the clipped sum


def _brute_force(
    model: nn.Module, views: torch.Tensor, y: torch.Tensor, clip: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Σ_i clip_C(mean_k ∇ℓ(view_ik)) one view at a time with plain autograd, and the mean norms."""
    params = dict(model.named_parameters())
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    norms = []
    for i in range(views.shape[0]):
        mean = {name: torch.zeros_like(p) for name, p in params.items()}
        for k in range(views.shape[1]):
            loss = F.cross_entropy(model(views[i, k].unsqueeze(0)), y[i : i + 1], reduction="sum")
            for (name, _), g in zip(params.items(), torch.autograd.grad(loss, list(params.values())), strict=True):
                mean[name] += g / views.shape[1]
        norm = torch.sqrt(sum(g.square().sum() for g in mean.values()))
        norms.append(norm)
        scale = min(1.0, clip / float(norm))
        for name in total:
            total[name] += scale * mean[name]
    return total, torch.stack(norms)


def _assert_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(ref)
    whole = float(torch.sqrt(sum(r.square().sum() for r in ref.values())))
    for name, r in ref.items():
        assert got[name].shape == r.shape, name
        assert float((got[name] - r).norm()) <= 1e-9 * (float(r.norm()) + 1e-3 * whole), name


@pytest.mark.parametrize("case", TINY, ids=[c[0] for c in TINY])
def test_both_engines_clip_each_rows_mean_over_its_views(case: tuple) -> None:
    model, X, y = _tiny(case)
    step, seed = 4, 9
    padding = default_padding(X.shape[2], X.shape[3])
    draws = draw_views(
        images=X.shape[0],
        views=VIEWS,
        padding=padding,
        generator=SecureRandom.from_seed(seed),
        step=step,
        device=X.device,
    )
    _, norms = _brute_force(model, augmented_views(X, draws, padding=padding), y, clip=1.0)
    clip = float(norms.median())  # about half of the rows clipped
    reference, _ = _brute_force(model, augmented_views(X, draws, padding=padding), y, clip=clip)
    inners = [PerSampleMapAggregator(AbadiClip(clip)), GhostClipAggregator(AbadiClip(clip))]
    if case[0] == "cnn":
        inners.append(GhostClipAggregator(AbadiClip(clip), pass2="recompute"))
    for inner in inners:
        aggregator = AugmultAggregator(inner, VIEWS)
        assert aggregator.sensitivity == clip
        got = aggregator.clipped_sum(
            model,
            X,
            y,
            step=step,
            loss="cross_entropy",
            max_physical_batch_size=2 * VIEWS,  # two rows per chunk: chunking is exercised
            generator=SecureRandom.from_seed(seed),
        )
        _assert_close(got, reference)
    assert all(p.grad is None for p in model.parameters())


def test_an_embedding_called_once_per_view_is_exact_in_the_ghost_engine() -> None:
    """The one ghost rule no image model uses: token views (b, K, T) through an Embedding and a
    LayerNorm, K calls each, against the vmap engine."""
    gen = torch.Generator().manual_seed(3)
    model = nn.Sequential(nn.Embedding(11, 4), nn.LayerNorm(4), nn.Flatten(), nn.Linear(4 * 5, 3)).double()
    tokens = torch.randint(0, 11, (6, VIEWS, 5), generator=gen)
    y = torch.randint(0, 3, (6,), generator=gen)
    wrapped, loss = AugmentedViews(model), mean_over_views("cross_entropy")
    reference = clipped_grad_sum(
        wrapped, tokens, y, loss=loss, per_sample_map=AbadiClip(0.05), max_physical_batch_size=4
    )
    got = ghost_clipped_grad_sum(
        wrapped, tokens, y, loss=loss, per_sample_map=AbadiClip(0.05), max_physical_batch_size=4
    )
    _assert_close(got, reference)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), clip=st.floats(1e-3, 10.0), views=st.integers(1, 4))
def test_every_rows_contribution_is_within_the_clipping_norm(seed: int, clip: float, views: int) -> None:
    model, X, y = _tiny(TINY[0], n=1, seed=seed)
    X = X * 50.0  # large inputs: large gradients, so most draws clip
    aggregator = with_augmult(GhostClipAggregator(AbadiClip(clip)), views)
    contribution = aggregator.clipped_sum(
        model, X, y, step=seed, loss="cross_entropy", max_physical_batch_size=8, generator=SecureRandom.from_seed(seed)
    )
    norm = float(torch.sqrt(sum(g.square().sum() for g in contribution.values())))
    assert 0.0 < norm <= clip * (1 + 1e-9)
    assert aggregator.sensitivity == clip


def test_an_empty_batch_contributes_zeros() -> None:
    model, X, y = _tiny(TINY[0], n=0)
    for inner in (PerSampleMapAggregator(AbadiClip(1.0)), GhostClipAggregator(AbadiClip(1.0))):
        total = AugmultAggregator(inner, VIEWS).clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=4, generator=SecureRandom.from_seed(0)
        )
        assert list(total) == [name for name, _ in model.named_parameters()]
        assert all(not bool(t.any()) for t in total.values())


def test_one_view_is_the_plain_aggregator() -> None:
    inner = GhostClipAggregator(AbadiClip(1.0))
    assert with_augmult(inner, None) is inner and with_augmult(inner, 1) is inner
    with pytest.raises(ValueError, match="views"):
        AugmultAggregator(inner, 0)
    with pytest.raises(ValueError, match="image rows"):
        AugmultAggregator(inner, 2).clipped_sum(
            nn.Linear(3, 2),
            torch.zeros(4, 3),
            torch.zeros(4, dtype=torch.int64),
            step=0,
            loss="cross_entropy",
            max_physical_batch_size=4,
            generator=SecureRandom.from_seed(0),
        )


# ----------------------------------------------------------------------------- the training loops


def _config(steps: int) -> DPSGDConfig:
    return DPSGDConfig(
        steps=steps,
        sampling_probability=0.5,
        noise_multiplier=1.0,
        clipping_norm=0.5,
        learning_rate=0.1,
        momentum=0.9,
        max_physical_batch_size=4,
    )


def test_dp_sgd_with_views_resumes_bit_exactly_and_draws_the_same_main_stream() -> None:
    model, X, y = _tiny(TINY[0], n=8)
    start = copy.deepcopy(model.state_dict())
    aggregator = AugmultAggregator(GhostClipAggregator(AbadiClip(0.5)), VIEWS)

    generator = SecureRandom.from_seed(21)
    train_dp_sgd(model, X, y, config=_config(3), generator=generator, aggregator=aggregator)
    uninterrupted, stream_after = copy.deepcopy(model.state_dict()), generator.get_state()

    saved: list[TrainingState] = []
    model.load_state_dict(start)
    hooks = TrainingHooks(save_checkpoint=saved.append, checkpoint_every=1, should_stop=lambda: len(saved) >= 2)
    train_dp_sgd(
        model, X, y, config=_config(3), generator=SecureRandom.from_seed(21), aggregator=aggregator, hooks=hooks
    )
    model.load_state_dict(start)
    train_dp_sgd(
        model, X, y, config=_config(3), generator=SecureRandom.from_seed(0), aggregator=aggregator, resume_from=saved[1]
    )
    for name, value in uninterrupted.items():
        assert torch.equal(model.state_dict()[name], value), name

    one_view = SecureRandom.from_seed(21)
    model.load_state_dict(start)
    train_dp_sgd(model, X, y, config=_config(3), generator=one_view, aggregator=GhostClipAggregator(AbadiClip(0.5)))
    assert torch.equal(one_view.get_state(), stream_after)  # same batches, same noise draws
    assert any(not torch.equal(model.state_dict()[k], v) for k, v in uninterrupted.items())  # other gradients


def test_a_non_private_step_averages_the_loss_over_each_images_views() -> None:
    model, X, y = _tiny(TINY[0], n=4)
    outputs, targets = forward_views(model, X, y, views=None, generator=SecureRandom.from_seed(1), step=0)
    assert torch.equal(outputs, model(X)) and targets is y
    outputs, targets = forward_views(model, X, y, views=VIEWS, generator=SecureRandom.from_seed(1), step=2)
    assert outputs.shape == (4 * VIEWS, 3) and torch.equal(targets, y.repeat_interleave(VIEWS))
    draws = draw_views(images=4, views=VIEWS, padding=1, generator=SecureRandom.from_seed(1), step=2, device=X.device)
    views = augmented_views(X, draws, padding=1)
    per_row = torch.stack(
        [
            torch.stack([F.cross_entropy(model(views[i, k : k + 1]), y[i : i + 1]) for k in range(VIEWS)]).mean()
            for i in range(4)
        ]
    )
    torch.testing.assert_close(F.cross_entropy(outputs, targets), per_row.mean())
