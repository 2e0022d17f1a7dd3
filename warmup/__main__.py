import sys

from warmup.cli import main

sys.exit(main())
