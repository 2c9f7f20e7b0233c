import sys

from trainforge.cli import main

sys.exit(main())
