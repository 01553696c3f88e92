"""`python -m splatq.services.cli ...`: the `splatq` command (what `splatq up` runs its
services with)."""

import sys

from splatq.services.cli.main import main

sys.exit(main())
