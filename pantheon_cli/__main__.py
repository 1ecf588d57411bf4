"""`python -m pantheon_cli ...`: the same as the `pantheon` command."""

import sys

from pantheon_cli.cli import main

sys.exit(main())
