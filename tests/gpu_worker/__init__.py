"""Tests for the GPU worker: artifact formats, geometry and rendering helpers."""
