"""`python3 -m lab ...`: the one entry point of the lab (see lab/cli.py)."""

import sys

from lab.cli import main

sys.exit(main())
