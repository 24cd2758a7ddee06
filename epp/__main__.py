"""``python -m epp``: same as the ``epp`` console script."""

import sys

from epp.cli import main

sys.exit(main())
