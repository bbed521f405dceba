"""`python -m blazr` — the same as the `blazr` console script."""

import sys

from blazr.cli import main

sys.exit(main())
