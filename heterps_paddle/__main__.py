import sys

from heterps_paddle.tools.cli import main

sys.exit(main())
