"""The command-line reference page, generated from the ``privtrain`` click commands themselves."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator

import click
from markdown_tables import code, table

from privtrain.cli import cli

PAGE_URI = "reference/cli.md"

_INTRO = """# Command-line reference

Generated from the `privtrain` command itself when the site is built, so it lists exactly the
commands and options the CLI has (`privtrain COMMAND --help` prints the same). How to use them
step by step: [Python client and CLI](../client-and-cli.md). Every command takes the global options
(`privtrain --url … --api-key … --json COMMAND …`).
"""


def commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command under ``group``, groups first then their commands, in alphabetical order."""
    for name in sorted(group.commands):
        command = group.commands[name]
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def _default(value: object) -> str:
    """A shown default: numbers, strings and paths (click's "unset" marker and callables show nothing)."""
    if isinstance(value, os.PathLike):
        return code(os.fspath(value))
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return code(value)
    return ""


def _option_rows(command: click.Command) -> list[list[str]]:
    rows = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            names = ", ".join(code(opt) for opt in (*param.opts, *param.secondary_opts))
            kind = "flag" if param.is_flag else param.type.name
            if isinstance(param.type, click.Choice):
                kind = "one of " + ", ".join(str(choice) for choice in param.type.choices)
            default = "" if param.is_flag or param.multiple else _default(param.default)
            rows.append([names, kind + (" (repeatable)" if param.multiple else ""), default, param.help or ""])
    return rows


def _usage(path: tuple[str, ...], command: click.Command) -> str:
    context = click.Context(command, info_name="privtrain " + " ".join(path))
    return command.get_usage(context).removeprefix("Usage: ")


def render_cli_page() -> str:
    parts = [
        _INTRO,
        "## Global options\n",
        table(["option", "takes", "default", "what it does"], _option_rows(cli)) + "\n",
    ]
    for path, command in commands():
        level = "##" if len(path) == 1 else "###"
        parts.append(f"{level} `privtrain {' '.join(path)}`\n")
        parts.append(inspect.cleandoc(command.help or command.short_help or "").replace("\b\n", "") + "\n")
        if not isinstance(command, click.Group):
            parts.append(f"```\n{_usage(path, command)}\n```\n")
            rows = _option_rows(command)
            if rows:
                parts.append(table(["option", "takes", "default", "what it does"], rows) + "\n")
    return "\n".join(parts)
