"""``python -m castcore``: the castcore command."""

from castcore.cli.main import console

console()
