import sys

from warmup.worker.main import main

sys.exit(main())
