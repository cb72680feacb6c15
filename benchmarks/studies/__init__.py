"""Finished studies behind findings in docs/accuracy.md, kept re-runnable: ``python -m benchmarks.studies.NAME``.

They read the accuracy benchmark's cache (benchmarks/cache) and simulate what it lacks; none is part of the
service, and code only a study uses lives here, not in advisor/ or models/.
"""
