"""The aiohttp REST gateway (accepts jobs, answers 202): arrives with issue #3.

Only this package may translate HTTP to engine calls; it must not run inference.
"""
