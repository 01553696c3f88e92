"""Talking to Redis: the client and its error classes (`client`), the embedded server."""
