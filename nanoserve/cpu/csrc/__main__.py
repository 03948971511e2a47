"""``python -m nanoserve.cpu.csrc``: build the C++ ops now (``make setup`` runs it)."""

import sys

from nanoserve.cpu.csrc import main

if __name__ == "__main__":  # not on import (pytest's doctest collection imports this file)
    sys.exit(main())
