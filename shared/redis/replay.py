"""Where a script call's replay memo lives (a Redis Cluster detail: the slot of the call's first
key), for the engine's scripts and the replica wait alike."""

from __future__ import annotations


def replay_key(first_key: str, request_id: str) -> str:
    """The replay memo of one script call (shared/engine/scripts.py), in the slot of the call's
    first key: the same `{...}` hash tag, or the whole key as the tag when it has none."""
    open_at = first_key.find("{")
    close_at = first_key.find("}", open_at + 1) if open_at >= 0 else -1
    if close_at > open_at + 1:
        return f"{first_key[: close_at + 1]}:replay:{request_id}"
    return f"{{{first_key}}}:replay:{request_id}"
