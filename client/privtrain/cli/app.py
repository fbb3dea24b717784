"""The ``privtrain`` command: its global options, and every command group under it."""

from __future__ import annotations

from collections.abc import Sequence

import click

from privtrain.cli.base_models import base_models
from privtrain.cli.catalogue import algorithms, models
from privtrain.cli.datasets import datasets
from privtrain.cli.jobs import jobs
from privtrain.cli.problems import ApiErrorGroup
from privtrain.cli.sharing import invitations
from privtrain.cli.state import CliEnvironment, CliState
from privtrain.cli.tokenizers import tokenizers
from privtrain.cli.tuning import tuning
from privtrain.client import DEFAULT_URL
from privtrain.version import __version__


@click.group(cls=ApiErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar="PRIVTRAIN_URL", default=DEFAULT_URL, show_default=True, help="service URL [env PRIVTRAIN_URL]"
)
@click.option("--api-key", envvar="PRIVTRAIN_API_KEY", help="API key [env PRIVTRAIN_API_KEY]")
@click.option("--json", "json_output", is_flag=True, help="JSON output for every command")
@click.option(
    "--request-timeout",
    "timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="per-request timeout (s)",
)
@click.version_option(__version__, prog_name="privtrain")
@click.pass_context
def cli(ctx: click.Context, url: str, api_key: str | None, json_output: bool, timeout: float) -> None:
    """Train models with differential privacy on a privtrain service."""
    environment = ctx.obj if isinstance(ctx.obj, CliEnvironment) else CliEnvironment()
    ctx.obj = CliState(url=url, api_key=api_key, json_output=json_output, timeout=timeout, environment=environment)


for _command in (
    algorithms,
    base_models,
    datasets,
    invitations,
    jobs,
    models,
    tokenizers,
    tuning,
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="privtrain")


if __name__ == "__main__":
    main()
