"""splatq's common library: settings, keys, Lua scripts, streams, leases, retries, workers.

Used by every service; it must not import from `services/`.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

try:
    # One source of truth: pyproject's [project] version, as installed (wheel or editable).
    __version__: str = _dist_version("splatq")
except PackageNotFoundError:  # a source tree on sys.path without any install
    __version__ = "0+unknown"

__all__ = ["__version__"]
