"""MkDocs hook: adds the generated reference pages to the site at build time.

The configuration reference, the algorithm and model catalogues and the command-line reference
are rendered from the code (the settings class, the registries, the CLI's commands), so they
cannot drift from it. Used from mkdocs.yml
(``hooks:``); MkDocs puts this folder on the import path while it loads the hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from catalogue_reference import ALGORITHMS_URI, MODELS_URI, render_algorithms_page, render_models_page
from cli_reference import PAGE_URI as CLI_URI
from cli_reference import render_cli_page
from configuration_reference import PAGE_URI as CONFIGURATION_URI
from configuration_reference import render_configuration_page
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

GENERATED_PAGES: Mapping[str, Callable[[], str]] = {
    CONFIGURATION_URI: render_configuration_page,
    ALGORITHMS_URI: render_algorithms_page,
    MODELS_URI: render_models_page,
    CLI_URI: render_cli_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Render every generated page and add it to the build (nothing is written to docs/)."""
    for uri, render in GENERATED_PAGES.items():
        files.append(File.generated(config, uri, content=render()))
    return files
