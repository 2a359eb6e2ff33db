"""``python -m smoosh``: the same as the ``smoosh`` command."""

from smoosh.cli import main

raise SystemExit(main())
