"""`python -m rlparity.report ...`: the same as `rlparity report ...`."""

import sys

from rlparity.commands.report import main

sys.exit(main())
