"""``python -m peagle ...``: the same command line as ``peagle ...``."""
import sys

from .cli import main

sys.exit(main())
