"""``privtrain``: the user CLI on top of :class:`privtrain.Client`.

Human tables by default, ``--json`` for scripts (the server's objects, unchanged). Exit codes:
0 ok, 1 API error (the problem's title and detail on stderr; also a watched job that did not
succeed), 2 usage error. Server administration stays in ``privtrain-admin``.
"""

from privtrain.cli.app import cli, main
from privtrain.cli.state import CliEnvironment

__all__ = ["CliEnvironment", "cli", "main"]
