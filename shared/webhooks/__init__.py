"""Webhooks: signing, the outbox store, endpoints, the SSRF guard, a reference receiver."""
