# torch's torchrun, with the libuv default its agent needs (see nolibuv.py).
# Its workers get it from sitecustomize.py when PYTHONPATH names this folder.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nolibuv  # noqa: E402

nolibuv.apply()

from torch.distributed.run import main  # noqa: E402

main()
