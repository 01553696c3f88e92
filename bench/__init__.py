"""Benchmarks: runnable scripts that print tables (`python -m bench.<name>`).

Never imported by services or shared/; figures go to docs/benchmarks.md.
"""
