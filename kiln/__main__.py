import sys

from kiln.cli import main

sys.exit(main())
