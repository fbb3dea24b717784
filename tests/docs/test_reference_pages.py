"""The generated reference pages list everything the code defines, so they cannot drift."""

from __future__ import annotations

import re

from catalogue_reference import render_algorithms_page, render_models_page
from cli_reference import commands, render_cli_page
from configuration_reference import env_var, render_configuration_page
from reference_pages import GENERATED_PAGES

from algorithms import ALGORITHMS
from kernel.config import Settings
from kernel.model_catalogue import MODELS


def test_configuration_page_lists_every_settings_field_with_its_env_var_and_description() -> None:
    page = render_configuration_page()
    for name, field in Settings.model_fields.items():
        row = next((line for line in page.splitlines() if f"`{env_var(name)}`" in line), None)
        assert row is not None, f"{env_var(name)} missing from the configuration reference"
        assert field.description, f"Settings.{name} has no description for the reference"
        assert field.description.split(";")[0][:40].replace("|", "\\|") in row


def test_configuration_page_shows_defaults_and_bounds() -> None:
    page = render_configuration_page()
    assert re.search(r"`PRIVTRAIN_MAX_ATTEMPTS` \| int \| `3` \| ≥ 1, ≤ 20 \|", page)
    assert re.search(r"`PRIVTRAIN_METRICS_TOKEN` \| secret string or unset \| unset \|", page)


def test_algorithm_catalogue_has_a_section_for_every_registered_algorithm() -> None:
    page = render_algorithms_page()
    for name in ALGORITHMS.names():
        entry = ALGORITHMS.get(name).describe()
        section = page.split(f"## `{name}`\n", 1)
        assert len(section) == 2, f"algorithm {name} missing from the catalogue"
        body = section[1].split("\n## ", 1)[0]
        assert entry["summary"] in body
        for hyperparameter in entry["hyperparameters_schema"].get("properties", {}):
            assert f"`{hyperparameter}`" in body, f"{name}.{hyperparameter} missing"
        if "training_fields" in entry:
            for field in entry["training_fields"]:
                assert f"`{field}`" in body


def test_model_catalogue_has_every_registered_model() -> None:
    page = render_models_page()
    for model in MODELS.values():
        assert f"## `{model.name}`" in page
        assert model.summary in page


def test_the_hook_adds_all_generated_pages() -> None:
    assert set(GENERATED_PAGES) == {
        "reference/configuration.md",
        "reference/algorithms.md",
        "reference/models.md",
        "reference/cli.md",
    }


def test_the_cli_page_has_every_command_with_its_help_and_options() -> None:
    """Every command (groups included) has a heading, a description and its options; none lacks help."""
    page = render_cli_page()
    for path, command in commands():
        assert f"`privtrain {' '.join(path)}`" in page
        assert (command.help or command.short_help or "").strip(), f"privtrain {' '.join(path)} has no help"
    for expected in ("`privtrain jobs generate`", "`privtrain tokenizers`", "`privtrain base-models upload-hf`"):
        assert expected in page
    assert "`--lora-target`" in page and "`--format`" in page
