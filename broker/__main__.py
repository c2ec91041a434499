"""`python -m fleetmq.broker`."""

import sys

from .cli import main

sys.exit(main())
