"""The process environment beyond the `SPLATQ_*` settings, read here and nowhere else (every
other module receives what it needs): a CUDA runtime variable the supervisor looks at before
it starts a GPU worker, the variables a vendor's configuration names for its secrets (read
again on each use, so a rotated secret needs no restart), and the environment a splatq
process hands to the children it starts."""

from __future__ import annotations

import os
from collections.abc import Mapping

SETTINGS_PREFIX = "SPLATQ_"


def process_environ() -> Mapping[str, str]:
    """The live process environment (a vendor credential's variable is looked up in it on
    each use)."""
    return os.environ


def cuda_devices_hidden() -> bool:
    """CUDA_VISIBLE_DEVICES hides every GPU ("" or "-1")."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1")


def environ_without_settings() -> dict[str, str]:
    """This process's environment less its `SPLATQ_*` variables: what a child it starts
    inherits before the child's own settings are added."""
    return {k: v for k, v in os.environ.items() if not k.startswith(SETTINGS_PREFIX)}


def process_environment(**overrides: str) -> dict[str, str]:
    """This process's environment plus `overrides`: what child services inherit."""
    env = dict(os.environ)
    env.update(overrides)
    return env
