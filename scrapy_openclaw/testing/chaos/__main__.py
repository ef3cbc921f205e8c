"""``python -m scrapy_openclaw.testing.chaos CONFIG.json``: the chaos site in this process (see :mod:`.cli`)."""

import sys

from scrapy_openclaw.testing.chaos.cli import main

if __name__ == "__main__":
    sys.exit(main())
