"""``python -m autoplan.cli``: the ``autoplan`` command."""

import sys

from autoplan.cli import main

sys.exit(main())
