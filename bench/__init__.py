"""xum benchmarks: every figure is a cost factor over a floor measured in the same run.

`python -m bench` (or `make bench`) prints a table; `--json` gives the same figures as JSON.
Never asserted in the test suite: numbers depend on the machine. See docs/PERFORMANCE.md.
"""
