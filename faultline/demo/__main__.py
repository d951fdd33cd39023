"""`python -m faultline.demo simulate PLAN`: the workload child `faultline demo` starts."""

from __future__ import annotations

import sys

from faultline.demo.simulator import main

if __name__ == "__main__":
    sys.exit(main())
