"""`python -m fleetmq.operator` runs the operator (same as `fleetmq-operator`)."""

import sys

from .cli import main

sys.exit(main())
