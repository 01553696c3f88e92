"""Tenants as data: their settings and API keys in Redis, and the GPU-quota saga."""
