"""Side-by-side benchmarks, run from the repository root: python -m bench.<name> [--quick]."""

import common.threads  # noqa: F401 (first: OpenMP reads its wait policy when torch loads)
