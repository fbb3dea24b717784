"""An API error as the CLI reports it: the problem on stderr, exit code 1, and what to type next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from privtrain.cli.state import EXIT_API_ERROR, CliState
from privtrain.errors import PrivtrainError
from privtrain.output import to_json

PROBLEM_HINTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "/problems/dataset-already-registered": lambda extra: (
        f"hint: privtrain datasets raise-budget {extra.get('existing_dataset_id', 'DATASET_ID')} "
        "--epsilon NEW_EPSILON --reason '…'\n"
        f"  or, to replace the upload: privtrain datasets delete {extra.get('existing_dataset_id', 'DATASET_ID')} "
        "and upload again (its ledger continues)"
    ),
}
"""What to type next, for problems whose way out is another CLI command."""


def report_error(error: PrivtrainError, *, as_json: bool) -> None:
    """The problem's title and detail (plus its type and extra members) on stderr."""
    if as_json and error.problem:
        click.echo(to_json(error.problem), err=True)
        return
    status = f" ({error.status})" if error.status else ""
    click.echo(f"Error: {error.title}{status}: {error.detail}", err=True)
    if error.type:
        click.echo(f"  type: {error.type}", err=True)
    for key, value in error.extra.items():
        if key != "errors":
            click.echo(f"  {key}: {value}", err=True)
    for item in error.extra.get("errors", []) or []:
        if isinstance(item, dict):
            click.echo(f"  - {'.'.join(map(str, item.get('loc', [])))}: {item.get('msg', '')}", err=True)
    hint = PROBLEM_HINTS.get(error.type or "")
    if hint is not None:
        click.echo(hint(dict(error.extra)), err=True)


class ApiErrorGroup(click.Group):
    """Turns client exceptions into exit code 1 with the problem on stderr (usage errors stay 2)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PrivtrainError as error:
            state = ctx.find_object(CliState)
            report_error(error, as_json=bool(state and state.json_output))
            ctx.exit(EXIT_API_ERROR)
        finally:
            state = ctx.find_object(CliState)
            if state is not None and state._client is not None:
                state._client.close()
