"""``python -m bench.apps``: a sitting (see :mod:`bench.apps.sitting`)."""

from __future__ import annotations

import sys

from bench.apps.sitting import main

sys.exit(main())
