"""`python -m rlparity.report ...`: the same as `rlparity report ...`."""

import sys

from rlparity.report.command import main

sys.exit(main())
