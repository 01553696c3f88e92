"""Tests of the webhook dispatcher."""
