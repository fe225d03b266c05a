"""`python -m peagle.train ...` (and `accelerate launch -m peagle.train ...`) = `peagle train ...`."""
import sys

from .cli import main

sys.exit(main())
