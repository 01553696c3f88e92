"""Standard Webhooks signing: conformance with the official `standardwebhooks` package both ways,
tamper detection, the ±5 minute window, rotation, and secret/id validation."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from splatq.shared.webhooks.signing import (
    SignatureError,
    generate_secret,
    parse_secret,
    read_headers,
    sign,
    signed_headers,
    verify,
)

# The official package's own known-answer vector (its tests/test_webhooks.py::test_sign_function).
KAT_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KAT_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
KAT_TIMESTAMP = 1614265330
KAT_BODY = b'{"test": 2432232314}'
KAT_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
OLD_SECRET = "whsec_" + base64.b64encode(bytes(range(100, 124))).decode()
MSG_ID = "evt_01J0000000000000000000000Z"
TS = 1_700_000_000

BODIES = [
    b"",
    b'{"event":"3d_reconstruction.completed","data":{"job_id":"job_001X"}}',
    '{"message":"Grüße, 東京 🎉","ε":"ζ"}'.encode(),
    "plain text, not JSON: ☃".encode(),
    bytes(range(32, 127)) * 40,
]


def _flip(data: bytes, index: int = 0) -> bytes:
    """`data` with one byte changed (or one byte added to an empty body)."""
    if not data:
        return b"x"
    changed = bytearray(data)
    changed[index] ^= 0x01
    return bytes(changed)


def _official_verify(secret: str, body: bytes, headers: dict[str, str]) -> None:
    # json_parse=False: the official verify json-parses by default and would fail on non-JSON
    # bodies (an empty one included) after the signature had already matched.
    Webhook(secret).verify(body, headers, json_parse=False)


def test_known_answer_vector_matches_the_official_package() -> None:
    """Our signature over the official package's test vector is byte-identical to its expected."""
    assert sign([KAT_SECRET], KAT_ID, KAT_TIMESTAMP, KAT_BODY) == KAT_SIGNATURE
    official = Webhook(KAT_SECRET).sign(
        KAT_ID, datetime.fromtimestamp(KAT_TIMESTAMP, UTC), KAT_BODY.decode()
    )
    assert official == KAT_SIGNATURE


@pytest.mark.parametrize("body", BODIES, ids=["empty", "json", "non-ascii-json", "text", "long"])
def test_our_signatures_verify_with_the_official_package(body: bytes) -> None:
    """Headers we sign for now verify with `standardwebhooks.Webhook(secret).verify`."""
    headers = signed_headers([SECRET], MSG_ID, int(time.time()), body)
    _official_verify(SECRET, body, headers)
    verify(SECRET, headers, body)


@pytest.mark.parametrize("body", BODIES, ids=["empty", "json", "non-ascii-json", "text", "long"])
def test_tampering_fails_in_the_official_package(body: bytes) -> None:
    """One changed byte of body, timestamp or id makes the official verify reject the delivery."""
    now = int(time.time())
    headers = signed_headers([SECRET], MSG_ID, now, body)
    tampered_bodies = [_flip(body)] + ([_flip(body, len(body) - 1)] if body else [])
    for tampered in tampered_bodies:
        with pytest.raises(WebhookVerificationError):
            _official_verify(SECRET, tampered, headers)
    with pytest.raises(WebhookVerificationError):
        _official_verify(SECRET, body, {**headers, "webhook-timestamp": str(now - 1)})
    with pytest.raises(WebhookVerificationError):
        _official_verify(SECRET, body, {**headers, "webhook-id": MSG_ID[:-1] + "Y"})


@pytest.mark.parametrize("body", BODIES, ids=["empty", "json", "non-ascii-json", "text", "long"])
def test_we_verify_what_the_official_package_signs(body: bytes) -> None:
    """A signature from `Webhook(secret).sign(id, datetime, str)` passes our verify."""
    now = int(time.time())
    signature = Webhook(SECRET).sign(MSG_ID, datetime.fromtimestamp(now, UTC), body.decode())
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": str(now), "webhook-signature": signature}
    verify(SECRET, headers, body)
    assert signature == sign([SECRET], MSG_ID, now, body)


@pytest.mark.parametrize("body", BODIES, ids=["empty", "json", "non-ascii-json", "text", "long"])
def test_we_reject_tampered_official_signatures(body: bytes) -> None:
    """Changing body, timestamp, id or signature of an official delivery gives the right code."""
    signature = Webhook(SECRET).sign(MSG_ID, datetime.fromtimestamp(TS, UTC), body.decode())
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": str(TS), "webhook-signature": signature}
    verify(SECRET, headers, body, now=TS)
    cases = [
        (_flip(body), headers),
        (body, {**headers, "webhook-timestamp": str(TS + 1)}),
        (body, {**headers, "webhook-id": MSG_ID + "0"}),
        (body, {**headers, "webhook-signature": signature[:-2] + "A="}),
        (body, {**headers, "webhook-signature": "v1," + base64.b64encode(bytes(32)).decode()}),
    ]
    for tampered_body, tampered_headers in cases:
        with pytest.raises(SignatureError) as info:
            verify(SECRET, tampered_headers, tampered_body, now=TS)
        assert info.value.code == "no_matching_signature"
    with pytest.raises(SignatureError) as info:
        verify(generate_secret(), headers, body, now=TS)
    assert info.value.code == "no_matching_signature"


def test_non_utf8_bodies_are_signed_and_verified_as_raw_bytes() -> None:
    """Bodies that are not UTF-8 sign and verify byte-exactly (no decode/re-encode step)."""
    body = b"\xff\xfe\x00binary\x80"
    headers = signed_headers([SECRET], MSG_ID, TS, body)
    verify(SECRET, headers, body, now=TS)
    with pytest.raises(SignatureError):
        verify(SECRET, headers, body.decode("latin-1").encode(), now=TS)


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [
        (0, True),
        (300, True),
        (-300, True),
        (300.5, False),
        (-300.5, False),
        (301, False),
        (-301, False),
        (86_400, False),
    ],
)
def test_tolerance_is_five_minutes_either_side_inclusive(offset: float, accepted: bool) -> None:
    """Timestamps up to exactly 300 s before or after now verify; anything further does not."""
    headers = signed_headers([SECRET], MSG_ID, TS, b"{}")
    if accepted:
        verify(SECRET, headers, b"{}", now=TS + offset)
    else:
        with pytest.raises(SignatureError) as info:
            verify(SECRET, headers, b"{}", now=TS + offset)
        assert info.value.code == "timestamp_out_of_tolerance"


def test_tolerance_is_configurable() -> None:
    """`tolerance_s` widens or narrows the window."""
    headers = signed_headers([SECRET], MSG_ID, TS, b"{}")
    verify(SECRET, headers, b"{}", now=TS + 3600, tolerance_s=3600)
    with pytest.raises(SignatureError, match="timestamp_out_of_tolerance"):
        verify(SECRET, headers, b"{}", now=TS + 11, tolerance_s=10)


def test_out_of_tolerance_is_checked_before_the_signature() -> None:
    """A stale delivery with a valid signature is rejected for its timestamp (replay window)."""
    headers = signed_headers([SECRET], MSG_ID, TS, b"{}")
    with pytest.raises(SignatureError) as info:
        verify(SECRET, headers, b"{}", now=TS + 301)
    assert info.value.code == "timestamp_out_of_tolerance"


def test_official_package_enforces_the_same_window_with_its_clock() -> None:
    """Our signatures 290 s off verify in the official package; 310 s off they fail there too."""
    now = int(time.time())
    for ts in (now - 290, now + 290):
        _official_verify(SECRET, b"{}", signed_headers([SECRET], MSG_ID, ts, b"{}"))
    for ts in (now - 310, now + 310):
        with pytest.raises(WebhookVerificationError, match=r"too (old|new)"):
            _official_verify(SECRET, b"{}", signed_headers([SECRET], MSG_ID, ts, b"{}"))


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "1.5",
        f"{TS}.0",
        "-5",
        " 12",
        "12 ",
        "+12",
        "1_700_000_000",
        "1e9",
        "\uff11\uff12\uff13",
        "0x10",
        "9" * 16,
    ],
)
def test_a_timestamp_that_is_not_integer_seconds_is_bad_timestamp(value: str) -> None:
    """Anything but plain ASCII digits in webhook-timestamp is `bad_timestamp`."""
    headers = {**signed_headers([SECRET], MSG_ID, TS, b"{}"), "webhook-timestamp": value}
    with pytest.raises(SignatureError) as info:
        verify(SECRET, headers, b"{}", now=TS)
    assert info.value.code == "bad_timestamp"


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_or_empty_header_is_missing_headers(name: str) -> None:
    """Without (or with an empty) id, timestamp or signature header: `missing_headers`."""
    headers = signed_headers([SECRET], MSG_ID, TS, b"{}")
    for broken in ({k: v for k, v in headers.items() if k != name}, {**headers, name: ""}):
        with pytest.raises(SignatureError) as info:
            verify(SECRET, broken, b"{}", now=TS)
        assert info.value.code == "missing_headers"


def test_conflicting_duplicate_headers_are_missing_headers() -> None:
    """Two spellings of one header with different values are refused, not guessed between."""
    headers = {**signed_headers([SECRET], MSG_ID, TS, b"{}"), "Webhook-Id": "evt_other"}
    with pytest.raises(SignatureError) as info:
        verify(SECRET, headers, b"{}", now=TS)
    assert info.value.code == "missing_headers"


def test_header_names_are_case_insensitive() -> None:
    """Header names in any case verify, here and in the official package."""
    now = int(time.time())
    headers = signed_headers([SECRET], MSG_ID, now, b"{}")
    for transform in (str.upper, str.title):
        cased = {transform(k): v for k, v in headers.items()}
        verify(SECRET, cased, b"{}", now=now)
        _official_verify(SECRET, b"{}", cased)
    assert read_headers({k.upper(): v for k, v in headers.items()}).msg_id == MSG_ID


def test_other_versions_and_malformed_entries_are_ignored() -> None:
    """v1a/v2 entries and garbage are skipped; the valid v1 among them still verifies."""
    valid = sign([SECRET], MSG_ID, TS, b"{}")
    decoy = base64.b64encode(bytes(32)).decode()
    header = " ".join(
        ["garbage", "v2," + valid[3:], "v1a," + decoy, "v1,not base64!", "", "v1,a,b", valid]
    )
    base = signed_headers([SECRET], MSG_ID, TS, b"{}")
    verify(SECRET, {**base, "webhook-signature": header}, b"{}", now=TS)
    only_other_versions = f"v2,{valid[3:]} v1a,{valid[3:]}"
    with pytest.raises(SignatureError) as info:
        verify(SECRET, {**base, "webhook-signature": only_other_versions}, b"{}", now=TS)
    assert info.value.code == "no_matching_signature"


def test_rotation_signs_with_every_secret_and_either_verifies_alone() -> None:
    """Old+new signatures in one header: each secret alone verifies, here and officially."""
    now = int(time.time())
    headers = signed_headers([OLD_SECRET, SECRET], MSG_ID, now, b'{"a":1}')
    entries = headers["webhook-signature"].split(" ")
    assert len(entries) == 2
    assert entries == [sign([s], MSG_ID, now, b'{"a":1}') for s in (OLD_SECRET, SECRET)]
    for secret in (OLD_SECRET, SECRET):
        verify(secret, headers, b'{"a":1}', now=now)
        _official_verify(secret, b'{"a":1}', headers)
    verify([generate_secret(), SECRET], headers, b'{"a":1}', now=now)
    with pytest.raises(SignatureError, match="no_matching_signature"):
        verify(generate_secret(), headers, b'{"a":1}', now=now)


def test_verify_takes_one_secret_or_several() -> None:
    """A receiver holding old and new secrets accepts a delivery signed with only one of them."""
    headers = signed_headers([SECRET], MSG_ID, TS, b"{}")
    verify(SECRET, headers, b"{}", now=TS)
    verify([OLD_SECRET, SECRET], headers, b"{}", now=TS)
    verify((SECRET,), headers, b"{}", now=TS)
    with pytest.raises(ValueError, match="at least one"):
        verify([], headers, b"{}", now=TS)


def test_signed_headers_are_the_three_standard_headers() -> None:
    """signed_headers gives exactly webhook-id, webhook-timestamp (str) and webhook-signature."""
    headers = signed_headers([SECRET], MSG_ID, TS, b"{}")
    assert headers == {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TS),
        "webhook-signature": sign([SECRET], MSG_ID, TS, b"{}"),
    }


@pytest.mark.parametrize(
    "msg_id", ["", "a" * 256, "has space", " lead", "tab\t", "nl\n", "é", "evt.1", "\x7f"]
)
def test_sign_rejects_ids_that_are_not_visible_ascii(msg_id: str) -> None:
    """Ids must be 1-255 visible ASCII characters without '.': ValueError otherwise."""
    with pytest.raises(ValueError, match="webhook id"):
        sign([SECRET], msg_id, TS, b"{}")


def test_sign_accepts_ids_up_to_255_visible_characters() -> None:
    """A 255-character id and one with punctuation sign and verify."""
    for msg_id in ("a" * 255, "evt_01J-Z:~!/+=@"):
        verify(SECRET, signed_headers([SECRET], msg_id, TS, b"{}"), b"{}", now=TS)


def test_sign_rejects_bad_timestamps_and_no_secrets() -> None:
    """Negative or non-integer timestamps and an empty secret list are ValueErrors."""
    with pytest.raises(ValueError, match="timestamp"):
        sign([SECRET], MSG_ID, -1, b"")
    with pytest.raises(ValueError, match="timestamp"):
        sign([SECRET], MSG_ID, True, b"")
    with pytest.raises(ValueError, match="timestamp"):
        sign([SECRET], MSG_ID, 1.5, b"")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        sign([], MSG_ID, TS, b"")


def test_generated_secrets_are_well_formed_random_and_officially_usable() -> None:
    """generate_secret gives whsec_ + base64 of nbytes fresh random bytes the official lib takes."""
    secrets = {generate_secret() for _ in range(50)}
    assert len(secrets) == 50
    for secret in secrets:
        assert secret.startswith("whsec_")
        assert len(parse_secret(secret)) == 32
    for nbytes in (24, 48, 64):
        secret = generate_secret(nbytes)
        assert len(parse_secret(secret)) == nbytes
        now = int(time.time())
        _official_verify(secret, b"{}", signed_headers([secret], MSG_ID, now, b"{}"))


@pytest.mark.parametrize("nbytes", [0, 16, 23, 65, 128])
def test_generate_secret_refuses_sizes_outside_24_to_64_bytes(nbytes: int) -> None:
    """Key sizes outside the spec's 24-64 bytes are ValueErrors."""
    with pytest.raises(ValueError, match="24-64"):
        generate_secret(nbytes)


def test_parse_secret_returns_the_decoded_key() -> None:
    """The key is the base64-decoded part after whsec_, with or without padding."""
    key = bytes(range(25))
    encoded = base64.b64encode(key).decode()
    assert encoded.endswith("=")
    assert parse_secret("whsec_" + encoded) == key
    assert parse_secret("whsec_" + encoded.rstrip("=")) == key
    assert parse_secret(KAT_SECRET) == base64.b64decode(KAT_SECRET[6:])


@pytest.mark.parametrize(
    "secret",
    [
        "",
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # no prefix (the official package accepts it)
        "WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_",
        "whsec_!!!!MfKQ9r8GKYqrTwjUPD8ILPZIo2La",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS w",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwA",  # 33 base64 characters: not whole bytes
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",  # 31 base64 characters: a 23-byte key
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw===",
        "whsec_MfKQ9r8G-_qrTwjUPD8ILPZIo2LaLaSw",  # urlsafe alphabet
        "whsec_" + base64.b64encode(bytes(23)).decode(),
        "whsec_" + base64.b64encode(bytes(65)).decode(),
    ],
)
def test_parse_secret_rejects_malformed_secrets(secret: str) -> None:
    """Missing prefix, bad base64 or a key outside 24-64 bytes is a ValueError."""
    with pytest.raises(ValueError, match="secret"):
        parse_secret(secret)


def test_a_malformed_configured_secret_is_a_value_error_not_a_signature_error() -> None:
    """verify with a broken secret fails loudly as configuration (ValueError)."""
    headers = signed_headers([SECRET], MSG_ID, TS, b"{}")
    with pytest.raises(ValueError, match="secret") as info:
        verify("whsec_short", headers, b"{}", now=TS)
    assert not isinstance(info.value, SignatureError)


def test_signature_error_carries_a_stable_code() -> None:
    """SignatureError exposes `.code` and mentions it in its message."""
    error = SignatureError("no_matching_signature", "details")
    assert error.code == "no_matching_signature"
    assert "no_matching_signature" in str(error)
