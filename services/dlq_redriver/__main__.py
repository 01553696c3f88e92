"""`python -m splatq.services.dlq_redriver`: the redriver (as `splatq redriver`)."""

from __future__ import annotations

import sys

from splatq.services.dlq_redriver.commands import main

if __name__ == "__main__":
    sys.exit(main())
