"""The hosted model's configuration: the docs page's complete example parses; every mistake is
refused naming the file and the key; secrets are read from where it says and never shown."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from splatq.shared.vendor.config import VendorConfigError, load_vendor_config, parse_vendor_config
from splatq.shared.vendor.credentials import Credential
from tests.helpers import REPO_ROOT
from tests.vendor.conftest import vendor_table


def docs_example() -> dict[str, Any]:
    text = (REPO_ROOT / "docs" / "hosted-model.md").read_text()
    block = re.search(r"<!-- hosted-model-config:.*?-->\n```toml\n(.*?)```", text, re.S)
    assert block is not None, "the docs page lost its configuration block"
    return tomllib.loads(block.group(1))


def test_the_docs_replicate_configuration_is_complete_and_valid() -> None:
    """The page's TRELLIS-on-Replicate configuration parses with every section it shows."""
    config = parse_vendor_config(docs_example(), "docs/hosted-model.md")
    assert config.version == "remote:replicate:firtoz/trellis:VERSION_ID"
    assert config.request.image_as == "url"
    assert config.request.image_list
    assert config.response.output_key == "gaussian_ply"
    assert config.webhook_url == "https://api.example.com/v1/vendor-webhooks/replicate"
    assert (config.limits.rate, config.limits.concurrency) == (600, 8)


def _table(**changes: dict[str, Any]) -> dict[str, Any]:
    table = vendor_table()
    for section, values in changes.items():
        table[section] = {**table.get(section, {}), **values}
    return table


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vendor": {"name": "Bad Name"}}, "t: vendor.name: 'Bad Name' does not match"),
        ({"vendor": {"base_url": "ftp://x"}}, "t: vendor.base_url: must be an http(s) URL"),
        ({"limits": {"rat": 5}}, "t: limits.rat: unknown key"),
        ({"limits": {"rate": 0}}, "t: limits.rate: must be an integer within [1, 1e+06]"),
        ({"limits": {"safety": 1.5}}, "t: limits.safety: must be a number within [0.5, 1]"),
        ({"auth": {"file": "/x"}}, "t: auth.env: name exactly one of env"),
        ({"request": {"headers": {"Authorization": "Bearer x"}}},
         "t: request.headers.Authorization: a credential belongs in [auth]"),
        ({"request": {"shape": "xml"}}, "t: request.shape: must be one of multipart | json"),
        ({"request": {"shape": "multipart", "image_field": "image", "image_as": "url"}},
         "t: request.image_as: applies to the json shape only"),
        ({"response": {"get_path": "/predictions"}}, "t: response.get_path: must contain {id}"),
        ({"response": {"cancel_path": "/x?y"}}, "t: response.cancel_path: must be a path"),
        ({"webhook": {"enabled": True}}, "t: webhook.public_url: must be the gateway's public"),
        ({"poll": {"initial_s": 5, "max_s": 1}}, "t: poll.max_s: must be >= initial_s"),
        ({"output": {"format": "glb"}}, "t: output.format: must be one of auto | ply | splat"),
    ],
)  # fmt: skip
def test_a_mistake_is_refused_naming_the_key(changes: dict[str, Any], message: str) -> None:
    """Unknown keys, out-of-range values and contradictions each name their key."""
    with pytest.raises(VendorConfigError) as err:
        parse_vendor_config(_table(**changes), "t")
    assert str(err.value).startswith(message), str(err.value)


def test_a_file_that_is_not_toml_or_missing_names_itself(tmp_path: Path) -> None:
    """The file's own problems name the file."""
    bad = tmp_path / "v.toml"
    bad.write_text("[vendor\n")
    with pytest.raises(VendorConfigError, match=rf"^{bad}: not valid TOML"):
        load_vendor_config(bad)
    with pytest.raises(VendorConfigError, match="no such file"):
        load_vendor_config(tmp_path / "absent.toml")


def test_a_secret_is_read_from_env_or_file_and_never_shown(tmp_path: Path) -> None:
    """From the variable, or the file (read again once it changes: a rotated secret); a
    missing one is an error naming where it looked; the credential's repr names no value."""
    config = parse_vendor_config(_table(auth={"env": "VENDOR_T"}), "t")
    with pytest.raises(VendorConfigError, match="VENDOR_T"):
        Credential(config.auth, environ={})
    cred = Credential(config.auth, environ={"VENDOR_T": "tok-123"})
    assert cred.header() == ("Authorization", "Bearer tok-123")
    assert "tok-123" not in repr(cred)
    secret = tmp_path / "token"
    secret.write_text("first-token\n")
    from_file = parse_vendor_config({**_table(), "auth": {"file": str(secret), "scheme": ""}}, "t")
    cred = Credential(from_file.auth)
    assert cred.header() == ("Authorization", "first-token")
    secret.write_text("second-token\n")
    os.utime(secret, (secret.stat().st_atime, secret.stat().st_mtime + 5))
    assert cred.value() == "second-token"
    secret.write_text("")
    os.utime(secret, (secret.stat().st_atime, secret.stat().st_mtime + 10))
    with pytest.raises(VendorConfigError, match="is empty"):
        cred.value()


def test_a_worker_or_gateway_with_a_bad_vendor_file_exits_78_naming_it(tmp_path: Path) -> None:
    """`splatq worker` and `splatq gateway` refuse an unusable hosted-model configuration at
    start with exit 78 and the reason (the key at fault), not a traceback."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    bad = tmp_path / "vendor.toml"
    bad.write_text('[vendor]\nname = "x"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update(SPLATQ_MODEL="remote", SPLATQ_REMOTE_CONFIG=str(bad),
               SPLATQ_REDIS_URL="redis://127.0.0.1:1")  # fmt: skip
    for command in ("worker", "gateway"):
        done = subprocess.run(
            [sys.executable, "-m", "splatq.services.cli", command],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 78, (command, done.stderr)
        assert f"splatq {command}: configuration error: {bad}: vendor.base_url" in done.stderr
        assert "Traceback" not in done.stderr
