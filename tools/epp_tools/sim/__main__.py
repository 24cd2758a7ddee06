"""``python -m epp_tools.sim``: same as ``epp sim``."""

from __future__ import annotations

import sys

from epp_tools.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
