"""`python -m worker` runs the depositd command line."""

import sys

from worker.cli import main

sys.exit(main())
