"""``python -m rdmanet.cli``: the ``rdmanet`` command."""

import sys

from .main import main

sys.exit(main())
