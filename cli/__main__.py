"""``python -m rollstream.cli ...`` is the ``rollstream`` command."""

import sys

from rollstream.cli.main import main

sys.exit(main())
