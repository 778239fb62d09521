"""`python -m align.cli ...`, as the `align` script runs it."""

import sys

from align.cli import main

sys.exit(main())
