import sys

from hydra_core.cli import main

sys.exit(main())
