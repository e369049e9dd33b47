"""``python -m diffquant`` is the ``diffquant`` command."""

import sys

from .cli import main

sys.exit(main())
