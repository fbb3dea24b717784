"""``python -m privtrain.cli``: the same as the ``privtrain`` console script."""

from privtrain.cli.app import main

main()
