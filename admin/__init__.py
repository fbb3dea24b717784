"""The ``privtrain-admin`` command: the embedded service, migrations, keys, a worker."""
