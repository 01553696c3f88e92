"""The webhook dispatcher (signed, durable delivery of job events): arrives with issue #5.

It will consume the per-partition events streams the engine already writes.
"""
