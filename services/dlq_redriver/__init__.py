"""The dead-letter redriver service (an automatic redrive policy): not built yet.

Operators redrive by hand today with `splatq dlq` (services/dlq_cli.py, redrive.lua).
"""
