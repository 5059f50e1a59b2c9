"""``python -m mqcore.ctl``: the ``mqctl`` command."""

import sys

from mqcore.ctl import main

sys.exit(main())
