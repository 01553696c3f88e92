"""The job engine: keys, the state table, Lua scripts, the queue API, leases, the worker runtime."""
