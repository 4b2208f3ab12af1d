import sys

from simdevice.cli import main

sys.exit(main())
