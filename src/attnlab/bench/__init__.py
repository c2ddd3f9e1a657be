"""Speed of attnlab's variants against peers: training throughput, MFU, inference, memory.

``attnlab bench`` is the command; ``run_bench(BenchSpec(config))`` the API. See
``benchmarks/README.md`` for the method and ``benchmarks/results/`` for recorded runs.
"""

from attnlab.bench.runner import BenchResult, BenchSpec, run_bench
from attnlab.bench.variants import VARIANTS, Variant, variant_config

__all__ = ["VARIANTS", "BenchResult", "BenchSpec", "Variant", "run_bench", "variant_config"]
