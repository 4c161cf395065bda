"""``python -m castcore``: the castcore command."""

import sys

from castcore.cli.main import main

sys.exit(main())
