"""splatq's common library: settings, keys, Lua scripts, streams, leases, retries, workers.

Used by every service; it must not import from `services/`.
"""
