"""Benchmark results by topic, and the comparison tools that made some of them (``benchmarks.tools``)."""
