"""Peer adapters: the same no-op workload run through other Redis job queues, for the benchmarks.

Benchmark-only code; the services must never import anything from here.
"""
