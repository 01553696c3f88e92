"""splatq's common library: settings, keys, Lua scripts, streams, leases, retries, the worker runtime.

Used by every service; it must not import from `services/`.
"""
