"""``python -m service.cli`` runs the ``tunehub`` command line."""

from service.cli import entry_point

entry_point()
