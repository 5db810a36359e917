"""`python -m workload.diagnose`: the same as the `diagnose` console script."""

import sys

from workload.diagnose import main

sys.exit(main())
