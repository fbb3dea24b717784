"""The CLI's per-invocation state and how a command prints: a table for people, ``--json`` for scripts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
import httpx

from privtrain.client import Client
from privtrain.events import ProgressSource, poll_progress
from privtrain.output import to_json
from privtrain.resources import Resource
from privtrain.retry import RetryNotice

ResourceT = TypeVar("ResourceT", bound=Resource)

EXIT_API_ERROR = 1


@dataclass
class CliEnvironment:
    """What a test (or an embedding program) injects through ``main(obj=...)``."""

    transport: httpx.BaseTransport | None = None
    progress_source: ProgressSource = poll_progress


@dataclass
class CliState:
    url: str
    api_key: str | None
    json_output: bool
    timeout: float
    environment: CliEnvironment
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            if not self.api_key:
                raise click.UsageError("no API key: pass --api-key or set PRIVTRAIN_API_KEY")
            self._client = Client(
                self.url,
                self.api_key,
                timeout=self.timeout,
                transport=self.environment.transport,
                on_retry=_say_retry,
            )
        return self._client


def _say_retry(notice: RetryNotice) -> None:
    click.echo(
        f"{notice.reason} on {notice.method} {notice.path}; retry {notice.attempt} in {notice.delay:g} s",
        err=True,
    )


def current_state() -> CliState:
    return click.get_current_context().find_object(CliState)  # type: ignore[return-value]


def wants_json() -> bool:
    return current_state().json_output


def _mark_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """``--json`` after a subcommand means the same as before it (errors included)."""
    state = ctx.find_object(CliState)
    if value and state is not None:
        state.json_output = True
    return value


json_flag = click.option(
    "--json",
    is_flag=True,
    expose_value=False,
    callback=_mark_json,
    is_eager=True,
    help="print the server's JSON instead of a table",
)


def emit(value: Resource | list[ResourceT] | dict[str, Any] | list[dict[str, Any]], human: Callable[[], str]) -> None:
    """JSON (raw server objects) for scripts, else the human rendering."""
    if wants_json():
        click.echo(to_json(_raw(value)))
    else:
        click.echo(human())


def _raw(value: Any) -> Any:
    if isinstance(value, Resource):
        return value.raw
    if isinstance(value, list):
        return [_raw(v) for v in value]
    return value
