"""``python -m meteor_spark.cli``: the same as the ``meteor`` console script."""

import sys

from meteor_spark.cli.main import main

sys.exit(main())
