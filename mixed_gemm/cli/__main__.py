"""``python -m mixed_gemm.cli``: the ``mixed-gemm`` script."""
from . import main

raise SystemExit(main())
