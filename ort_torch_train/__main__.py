"""``python -m ort_torch_train``: the ``ort-torch-train`` command line."""

import sys

from ort_torch_train.cli.main import main

sys.exit(main())
