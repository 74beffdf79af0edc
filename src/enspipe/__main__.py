import sys

from enspipe.cli import main

sys.exit(main())
