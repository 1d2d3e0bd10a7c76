"""`python -m sleuthd.cli`: the `sleuthd` command."""

import sys

from sleuthd.cli.main import main

sys.exit(main())
