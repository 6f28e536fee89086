"""`python -m worker` runs the depositd command line."""

import sys

from worker.commands.cli import main

sys.exit(main())
