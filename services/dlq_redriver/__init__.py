"""The dead-letter redriver service (an automatic redrive policy): not built yet.

Operators redrive by hand today with `splatq dlq` (services/cli/dlq.py, redrive.lua).
"""
