"""``python -m litekiln.cli``."""

import sys

from litekiln.cli.main import main

sys.exit(main())
