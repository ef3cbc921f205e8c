"""The benchmark suite: scrapy-openclaw side by side with plain Scrapy, in one run.

    python -m benchmarks list
    python -m benchmarks run [SCENARIO ...] [--repeat N] [--quick] [--out DIR]

Every scenario module has ``run(quick: bool) -> dict`` and crawls a local
chaos site (loopback only) with each configuration it compares; the suite
(:mod:`benchmarks.suite`) repeats them, takes medians and writes the report
(:mod:`benchmarks.report`).
"""
