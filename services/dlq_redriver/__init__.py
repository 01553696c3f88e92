"""The dead-letter redriver: inspects and re-enqueues dead-lettered jobs (not built yet).

The engine already writes the per-partition dead-letter streams it will read.
"""
