"""Tests of the REST gateway, its upload validation and the generated image corpus."""
