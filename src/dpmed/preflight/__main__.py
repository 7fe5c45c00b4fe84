"""`python -m dpmed.preflight` (`dpmed.preflight.run`)."""

import sys

from dpmed.preflight.run import main

sys.exit(main())
