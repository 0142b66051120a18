"""The benchmarks of trilink-spark (not installed with the library).

Each folder mirrors a subpackage and holds ``bench_*.py`` scripts (``python
benches/run_all.py`` runs them all; each writes its JSON under ``benches/results/``, and
``benches/RESULTS.md`` reads them). :mod:`benches.ysb` is the Yahoo Streaming Benchmark
application, run from the repository root with ``python -m benches.ysb``.
"""
