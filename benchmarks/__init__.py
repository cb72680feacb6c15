"""The commands behind the accuracy figures in docs/accuracy.md; run each from the repository's root.

* ``python -m benchmarks.accuracy``: every model against long transfers on ns-2 (report: accuracy_report);
* ``sudo .venv/bin/python -m benchmarks.testbed_accuracy``: the same on emulated paths in network namespaces;
* ``sudo .venv/bin/python -m benchmarks.testbed_check``: the namespace test bed itself (RTT, jitter, goodput);
* ``python -m benchmarks.load_advice``: the advice service's GET /advice under load.

Finished studies whose findings docs/accuracy.md cites live in :mod:`benchmarks.studies`.
"""
