"""The client builds the text-training fields of a job spec: LoRA adapters and the token loss."""

from __future__ import annotations

from click.testing import CliRunner

from kernel.schemas.jobs import JobCreate
from privtrain.cli import cli
from privtrain.specs import SpecOverrides, build_job_spec, merge_spec


def test_build_job_spec_sets_lora_and_token_loss() -> None:
    spec = build_job_spec(
        dataset_id="ds_text",
        model="transformer-lm",
        algorithm="dp-sgd",
        target_epsilon=8.0,
        steps=10,
        batch_size=32,
        learning_rate=0.5,
        init_job="job_base",
        finetune="lora",
        lora_rank=8,
        lora_alpha=16.0,
        token_loss="sum",
    )
    assert spec["training"]["lora"] == {"rank": 8, "alpha": 16.0}
    assert spec["training"]["token_loss"] == "sum"
    parsed = JobCreate.model_validate(spec)  # what the server accepts
    assert parsed.training.lora is not None and parsed.training.lora.rank == 8


def test_lora_flags_override_one_member_of_a_spec_file() -> None:
    base = {"training": {"finetune": "lora", "lora": {"rank": 4, "alpha": 8}}}
    merged = merge_spec(base, SpecOverrides(lora_rank=2))
    assert merged["training"]["lora"] == {"rank": 2, "alpha": 8}
    assert "lora" not in merge_spec(None, SpecOverrides(steps=3))["training"]


def test_the_cli_offers_the_text_flags() -> None:
    help_text = CliRunner().invoke(cli, ["jobs", "submit", "--help"]).output
    for flag in ("--lora-rank", "--lora-alpha", "--lora-target", "--token-loss"):
        assert flag in help_text
    assert "lora" in help_text.split("--finetune ")[1].split("\n")[0]


def test_lora_targets_become_target_modules_and_the_server_accepts_them() -> None:
    spec = build_job_spec(
        dataset_id="ds_text",
        model="hf",
        algorithm="dp-sgd",
        target_epsilon=8.0,
        steps=10,
        batch_size=32,
        learning_rate=0.5,
        init_base_model="bm_base",
        finetune="lora",
        lora_rank=4,
        lora_targets=["c_attn", "c_fc"],
    )
    assert spec["training"]["lora"] == {"rank": 4, "target_modules": ["c_attn", "c_fc"]}
    parsed = JobCreate.model_validate(spec)
    assert parsed.training.lora is not None and parsed.training.lora.target_modules == ["c_attn", "c_fc"]
    base = {"training": {"finetune": "lora", "lora": {"rank": 4, "target_modules": ["c_attn"]}}}
    assert merge_spec(base, SpecOverrides(lora_alpha=2.0))["training"]["lora"]["target_modules"] == ["c_attn"]


def test_the_dp_evaluation_block_has_flags_and_the_server_accepts_what_they_build() -> None:
    merged = merge_spec(
        {"dataset_id": "ds_1", "training": {"steps": 3}},
        SpecOverrides(eval_holdout_fraction=0.2, eval_epsilon=0.5),
    )
    assert merged["evaluation"] == {"holdout_fraction": 0.2, "epsilon": 0.5}
    gaussian = merge_spec(merged, SpecOverrides(eval_mechanism="gaussian", eval_noise_multiplier=3.0))
    assert gaussian["evaluation"]["mechanism"] == "gaussian" and gaussian["evaluation"]["noise_multiplier"] == 3.0
    assert "evaluation" not in merge_spec(None, SpecOverrides(steps=3))
    spec = {
        **merged,
        "model": {"name": "mlp", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {}},
        "privacy": {"target_epsilon": 1.0},
        "training": {"steps": 3, "batch_size": 8, "learning_rate": 0.1},
    }
    parsed = JobCreate.model_validate(spec)
    assert parsed.evaluation is not None and parsed.evaluation.holdout_fraction == 0.2
    help_text = CliRunner().invoke(cli, ["jobs", "estimate", "--help"]).output
    for flag in ("--eval-holdout-fraction", "--eval-mechanism", "--eval-epsilon", "--eval-noise-multiplier"):
        assert flag in help_text
