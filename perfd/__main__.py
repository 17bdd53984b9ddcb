"""`python -m perfd ARGS`: the `perfd` command (perfd.app.cli)."""

from __future__ import annotations

import sys

from perfd.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
