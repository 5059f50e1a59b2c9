"""``python -m examples.flights``: run the flights pipeline (see :mod:`examples.flights.run`)."""

import sys

from examples.flights.run import main

sys.exit(main())
