"""SSRF guard: address classification and URL checks (pure), and connect-time blocking through
aiohttp against receivers on 127.0.0.1 (loopback only)."""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer

from splatq.shared.webhooks.ssrf import (
    INVALID_WEBHOOK_URL,
    MAX_URL_LENGTH,
    BlockedAddress,
    GuardedResolver,
    UrlRejected,
    address_problem,
    check_url,
    guarded_connector,
    guarded_socket,
    parse_legacy_ipv4,
    resolve_checked,
)

TIMEOUT = aiohttp.ClientTimeout(total=10)

# ---------------------------------------------------------------- address_problem (pure)

BLOCKED_ADDRESSES = [
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.5.4", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link_local"),
    ("100.64.0.1", "cgnat"),
    ("100.127.255.255", "cgnat"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "this_network"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("240.0.0.1", "reserved"),
    ("192.0.0.8", "reserved"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("192.88.99.1", "6to4"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link_local"),
    ("fe80::1%eth0", "link_local"),
    ("fc00::1", "private"),
    ("fd12::1", "private"),
    ("fd00:ec2::254", "private"),  # AWS IPv6 instance metadata
    ("fec0::1", "site_local"),
    ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "ipv4_mapped:loopback"),
    ("::ffff:10.0.0.1", "ipv4_mapped:private"),
    ("::ffff:169.254.169.254", "ipv4_mapped:link_local"),
    ("::7f00:1", "ipv4_compatible:loopback"),
    ("::8.8.8.8", "ipv4_compatible"),
    ("::ffff:0:7f00:1", "ipv4_translated:loopback"),
    ("::ffff:0:808:808", "ipv4_translated"),
    ("64:ff9b::7f00:1", "nat64"),
    ("64:ff9b::808:808", "nat64"),
    ("64:ff9b:1::1", "nat64"),
    ("2002:7f00:1::1", "6to4"),
    ("2002:808:808::1", "6to4"),
    ("2001::1", "teredo"),
    ("2001:2::1", "benchmarking"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation"),
    ("2001:10::1", "reserved"),
    ("100::1", "discard"),
    ("::1:0:0:1", "reserved"),
    ("4000::1", "reserved"),
]

GLOBAL_ADDRESSES = [
    "8.8.8.8",
    "1.1.1.1",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:8.8.8.8",
    # Just outside the blocked IPv4 ranges.
    "9.255.255.255",
    "11.0.0.0",
    "100.63.255.255",
    "100.128.0.0",
    "126.255.255.255",
    "128.0.0.0",
    "169.253.255.255",
    "169.255.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "192.167.255.255",
    "192.169.0.0",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
]


@pytest.mark.parametrize(("ip", "reason"), BLOCKED_ADDRESSES)
def test_address_problem_names_the_blocked_range(ip: str, reason: str) -> None:
    """Every non-public address is refused with the reason code of its range."""
    assert address_problem(ip) == reason


@pytest.mark.parametrize("ip", GLOBAL_ADDRESSES)
def test_address_problem_passes_global_addresses(ip: str) -> None:
    """Publicly routable addresses (and an IPv4-mapped public one) have no problem."""
    assert address_problem(ip) is None


@pytest.mark.parametrize(("ip", "reason"), [*BLOCKED_ADDRESSES[:3], ("8.8.8.8", None)])
def test_address_problem_accepts_address_objects(ip: str, reason: str | None) -> None:
    """ipaddress objects are classified exactly like their string form."""
    assert address_problem(ipaddress.ip_address(ip)) == reason


@pytest.mark.parametrize("text", ["example.com", "127.1", "", "::ffff:1.2.3", "1.2.3.4/32"])
def test_address_problem_rejects_non_addresses(text: str) -> None:
    """A string that is not a strict IP address raises ValueError instead of passing."""
    with pytest.raises(ValueError, match="does not appear to be"):
        address_problem(text)


@pytest.mark.parametrize(
    "network",
    [
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
        "2001::/32",
    ],
)
def test_whole_blocked_networks_are_blocked_edge_to_edge(network: str) -> None:
    """The first and last address of each blocked network are blocked (no off-by-one masks)."""
    net = ipaddress.ip_network(network)
    assert address_problem(net.network_address) is not None
    assert address_problem(net.broadcast_address) is not None


# ---------------------------------------------------------------- legacy IPv4 forms (pure)

LEGACY_IPV4 = [
    ("2130706433", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("0X7F.1", "127.0.0.1"),
    ("017700000001", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),
    ("127.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("0x0000000000007f.1", "127.0.0.1"),
    ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
    ("00", "0.0.0.0"),
    ("1.2.3.4", "1.2.3.4"),
    ("134744072", "8.8.8.8"),
]


@pytest.mark.parametrize(("text", "expected"), LEGACY_IPV4)
def test_legacy_ipv4_forms_normalise_like_inet_aton(text: str, expected: str) -> None:
    """Decimal, octal and hex IPv4 forms read as the address the C library connects to."""
    assert parse_legacy_ipv4(text) == ipaddress.IPv4Address(expected)
    assert socket.inet_aton(text) == ipaddress.IPv4Address(expected).packed


@pytest.mark.parametrize(
    "text", ["08", "0x1g", "1..2", "", "4294967296", "1.16777216", "1.2.3.4.5", "256.1.1.1", "a"]
)
def test_invalid_legacy_ipv4_forms_are_not_addresses(text: str) -> None:
    """What inet_aton refuses is not an address either (None)."""
    assert parse_legacy_ipv4(text) is None
    with pytest.raises(OSError, match="illegal"):
        socket.inet_aton(text)


# ---------------------------------------------------------------- check_url (pure)

REJECTED_URLS: list[tuple[str, dict[str, Any], str]] = [
    ("ftp://example.com/hook", {}, "scheme must be https, not 'ftp'"),
    ("ftp://example.com/hook", {"require_https": False}, "scheme must be http or https"),
    ("http://example.com/hook", {}, "scheme must be https, not 'http'"),
    ("example.com/hook", {}, "scheme must be https, not 'missing'"),
    ("https://user:pw@example.com/hook", {}, "userinfo"),
    ("https://user@example.com/hook", {}, "userinfo"),
    ("https://127.0.0.1:443@evil.example/", {}, "userinfo"),
    ("https:///hook", {}, "no host"),
    ("https://:443/hook", {}, "no host"),
    ("https:example.com", {}, "no host"),
    ("https://example.com:0/", {}, "port must be in 1-65535"),
    ("https://example.com:65536/", {}, "Port out of range"),
    ("https://example.com:https/", {}, "does not parse"),
    ("https://localhost/", {}, "local-only name (.localhost)"),
    ("https://LOCALHOST./", {}, "local-only name (.localhost)"),
    ("https://api.localhost/", {}, "local-only name (.localhost)"),
    ("https://printer.local/", {}, "local-only name (.local)"),
    ("https://svc.ns.svc.cluster.local/", {}, "local-only name (.local)"),
    ("https://metadata.google.internal/", {}, "local-only name (.internal)"),
    ("https://router.home.arpa/", {}, "local-only name (.home.arpa)"),
    ("https://redis:6379/", {}, "single-label name"),
    ("https://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/", {}, "(.localhost)"),
    ("https://127.0.0.1/", {}, "127.0.0.1 is not a publicly routable address (loopback)"),
    ("https://10.1.2.3:8443/hook", {}, "(private)"),
    ("https://[::1]/", {}, "[::1] is not a publicly routable address (loopback)"),
    ("https://[::ffff:127.0.0.1]/", {}, "(ipv4_mapped:loopback)"),
    ("https://[64:ff9b::7f00:1]/", {}, "(nat64)"),
    ("https://[fe80::1%25eth0]/", {"allow_private": True}, "zone identifier"),
    ("https://[v1.fe]/", {}, "not an IPv6 address"),
    ("http://2130706433/", {"require_https": False}, "(127.0.0.1, loopback)"),
    ("http://0x7f.1/", {"require_https": False}, "(127.0.0.1, loopback)"),
    ("http://017700000001/", {"require_https": False}, "(127.0.0.1, loopback)"),
    ("https://127.1/", {}, "non-canonical IPv4 literal (127.0.0.1, loopback)"),
    ("https://127.0.0.1./", {}, "non-canonical IPv4 literal"),
    ("https://2130706433/", {"allow_private": True}, "non-canonical IPv4 literal"),
    ("https://134744072/", {}, "non-canonical IPv4 literal (8.8.8.8)"),
    ("https://1.2.3.256/", {}, "ends in a number but is not a valid IPv4 address"),
    ("https://example.123/", {}, "ends in a number"),
    ("https://169.254.169.254/latest/meta-data", {}, "(link_local)"),
    ("https://exa%6dple.com/", {}, "not a valid hostname"),
    ("https://exa mple.com/", {}, "whitespace"),
    ("https://example.com\t/hook", {}, "'\\t'"),
    ("https://example.com\\@127.0.0.1/", {}, "backslashes"),
    ("https://" + "a" * 64 + ".example/", {}, "not a valid hostname"),
    ("https://example.com/" + "a" * (MAX_URL_LENGTH - 19), {}, "the limit is 2048"),
]


@pytest.mark.parametrize(("url", "kwargs", "message"), REJECTED_URLS)
def test_check_url_rejects_unsafe_urls(url: str, kwargs: dict[str, Any], message: str) -> None:
    """Each unsafe or malformed URL is refused with a message that says why."""
    with pytest.raises(UrlRejected) as caught:
        check_url(url, **kwargs)
    assert message in str(caught.value)


def test_url_rejected_is_a_value_error_with_a_stable_code() -> None:
    """UrlRejected is a ValueError carrying the API code invalid_webhook_url."""
    with pytest.raises(ValueError, match="scheme") as caught:
        check_url("ftp://example.com/")
    assert isinstance(caught.value, UrlRejected)
    assert caught.value.code == INVALID_WEBHOOK_URL == "invalid_webhook_url"


def test_rejection_messages_do_not_echo_the_query_string() -> None:
    """Messages name the host, never the whole URL (its query may carry a secret token)."""
    with pytest.raises(UrlRejected) as caught:
        check_url("https://127.0.0.1/hook?token=s3cret")
    assert "s3cret" not in str(caught.value)


ACCEPTED_URLS: list[tuple[str, dict[str, Any], str]] = [
    ("https://example.com/hook", {}, "example.com"),
    ("HTTPS://Example.COM/hook?x=1#frag", {}, "example.com"),
    ("https://example.com./hook", {}, "example.com."),
    ("https://hooks.example.com:8443/a/b", {}, "hooks.example.com"),
    ("https://b\u00fccher.example/", {}, "b\u00fccher.example"),
    ("https://my_host.example.com/", {}, "my_host.example.com"),
    ("https://8.8.8.8/hook", {}, "8.8.8.8"),
    ("https://[2606:4700:4700::1111]/hook", {}, "2606:4700:4700::1111"),
    ("https://example.com/" + "a" * (MAX_URL_LENGTH - 20), {}, "example.com"),
    ("http://example.com/hook", {"require_https": False}, "example.com"),
    ("http://127.0.0.1:8080/hook", {"allow_private": True, "require_https": False}, "127.0.0.1"),
    ("https://127.0.0.1:8443/hook", {"allow_private": True}, "127.0.0.1"),
    ("https://[::1]:8443/hook", {"allow_private": True}, "::1"),
    ("https://localhost:8443/hook", {"allow_private": True}, "localhost"),
    ("https://receiver:8443/hook", {"allow_private": True}, "receiver"),
    ("https://169.254.169.254/", {"allow_private": True}, "169.254.169.254"),
]


@pytest.mark.parametrize(("url", "kwargs", "hostname"), ACCEPTED_URLS)
def test_check_url_accepts_safe_urls(url: str, kwargs: dict[str, Any], hostname: str) -> None:
    """Public https URLs pass (and loopback ones with allow_private); the split URL is returned."""
    parts = check_url(url, **kwargs)
    assert parts.hostname == hostname
    assert parts == urllib.parse.urlsplit(url)


def test_check_url_is_https_only_by_default() -> None:
    """Production defaults: https required and private targets refused."""
    with pytest.raises(UrlRejected, match="scheme"):
        check_url("http://example.com/")
    with pytest.raises(UrlRejected, match="loopback"):
        check_url("https://127.0.0.1/")


# ---------------------------------------------------------------- resolver (no real DNS)


class FakeResolver(AbstractResolver):
    """Answers from a script: each resolve pops the next address list for the host."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.calls.append(host)
        addresses = self.answers[host].pop(0)
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
            for a in addresses
        ]

    async def close(self) -> None:
        self.closed = True


async def test_resolve_checked_blocks_if_any_address_is_private() -> None:
    """One private address among public ones blocks the whole name."""
    fake = FakeResolver({"hook.example": [["8.8.8.8", "2606:4700:4700::1111", "10.0.0.7"]]})
    with pytest.raises(BlockedAddress) as caught:
        await resolve_checked("hook.example", 443, allow_private=False, resolver=fake)
    assert (caught.value.host, caught.value.address, caught.value.reason) == (
        "hook.example",
        "10.0.0.7",
        "private",
    )
    # The message names neither the address nor its kind (a DNS oracle if echoed).
    assert "10.0.0.7" not in str(caught.value)
    assert "private" not in str(caught.value)
    assert "'hook.example' resolves to an address that is not publicly routable" in str(
        caught.value
    )


async def test_resolve_checked_returns_public_answers() -> None:
    """An all-public answer comes back unchanged, and a caller-supplied resolver stays open."""
    fake = FakeResolver({"hook.example": [["8.8.8.8", "2606:4700:4700::1111"]]})
    results = await resolve_checked("hook.example", 443, allow_private=False, resolver=fake)
    assert [r["host"] for r in results] == ["8.8.8.8", "2606:4700:4700::1111"]
    assert not fake.closed


async def test_resolve_checked_allow_private_lets_anything_through() -> None:
    """allow_private=True (dev/tests) turns the address check off."""
    fake = FakeResolver({"hook.example": [["127.0.0.1", "169.254.169.254"]]})
    results = await resolve_checked("hook.example", 80, allow_private=True, resolver=fake)
    assert [r["host"] for r in results] == ["127.0.0.1", "169.254.169.254"]


async def test_resolve_checked_refuses_an_empty_answer() -> None:
    """No addresses is a resolution error, never an empty list."""
    fake = FakeResolver({"hook.example": [[]]})
    with pytest.raises(socket.gaierror, match="no addresses"):
        await resolve_checked("hook.example", 443, allow_private=False, resolver=fake)


async def test_resolve_checked_blocks_unparseable_answers() -> None:
    """An answer that is not an IP address fails closed."""
    fake = FakeResolver({"hook.example": [["not-an-ip"]]})
    with pytest.raises(BlockedAddress) as caught:
        await resolve_checked("hook.example", 443, allow_private=False, resolver=fake)
    assert caught.value.reason == "unparseable"


async def test_resolve_checked_localhost_with_the_default_resolver() -> None:
    """ "localhost" really resolves to loopback here and is blocked; allowed with allow_private."""
    with pytest.raises(BlockedAddress) as caught:
        await resolve_checked("localhost", 80, allow_private=False)
    assert caught.value.reason == "loopback"
    results = await resolve_checked("localhost", 80, allow_private=True)
    assert {address_problem(r["host"]) for r in results} == {"loopback"}


async def test_resolve_checked_checks_ip_literals_too() -> None:
    """An IP literal goes through the same check as a name."""
    with pytest.raises(BlockedAddress, match="link_local"):
        await resolve_checked("169.254.169.254", 80, allow_private=False)


async def test_guarded_resolver_rechecks_every_resolve_dns_rebinding() -> None:
    """A name that was public at the first resolve and loopback at the next is blocked then."""
    fake = FakeResolver({"rebind.example": [["8.8.8.8"], ["127.0.0.1"]]})
    guard = GuardedResolver(allow_private=False, resolver=fake)
    first = await guard.resolve("rebind.example", 443, socket.AF_UNSPEC)
    assert [r["host"] for r in first] == ["8.8.8.8"]
    with pytest.raises(BlockedAddress) as caught:
        await guard.resolve("rebind.example", 443, socket.AF_UNSPEC)
    assert caught.value.reason == "loopback"
    assert fake.calls == ["rebind.example", "rebind.example"]
    await guard.close()
    assert not fake.closed


async def test_guarded_resolver_blocks_localhost() -> None:
    """With aiohttp's default resolver, "localhost" is refused (loopback)."""
    guard = GuardedResolver()
    try:
        with pytest.raises(BlockedAddress) as caught:
            await guard.resolve("localhost", 80, socket.AF_UNSPEC)
        assert caught.value.reason == "loopback"
    finally:
        await guard.close()


@pytest.mark.parametrize(
    ("family", "sockaddr", "reason"),
    [
        (socket.AF_INET, ("127.0.0.1", 80), "loopback"),
        (socket.AF_INET, ("169.254.169.254", 80), "link_local"),
        (socket.AF_INET6, ("::1", 80, 0, 0), "loopback"),
        (socket.AF_INET6, ("::ffff:10.0.0.1", 80, 0, 0), "ipv4_mapped:private"),
    ],
)
def test_guarded_socket_refuses_blocked_targets(
    family: socket.AddressFamily, sockaddr: tuple[Any, ...], reason: str
) -> None:
    """The socket factory refuses to create a socket for a blocked destination."""
    with pytest.raises(BlockedAddress) as caught:
        guarded_socket((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
    assert caught.value.reason == reason


def test_guarded_socket_creates_sockets_for_public_targets() -> None:
    """A public destination gets an ordinary (unconnected) socket."""
    sock = guarded_socket(
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("8.8.8.8", 443))
    )
    try:
        assert sock.family == socket.AF_INET
        assert sock.type == socket.SOCK_STREAM
    finally:
        sock.close()


async def test_guarded_connector_owns_its_settings() -> None:
    """The connector refuses a caller's resolver/socket_factory and sets per-host limits."""
    with pytest.raises(TypeError, match="resolver"):
        guarded_connector(False, resolver=FakeResolver({}))
    with pytest.raises(TypeError, match="socket_factory"):
        guarded_connector(False, socket_factory=socket.socket)
    connector = guarded_connector(False)
    try:
        assert connector.limit_per_host == 4
        assert connector.use_dns_cache
    finally:
        await connector.close()
    assert connector.closed


async def test_closing_the_session_closes_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that owns the guarded connector closes its GuardedResolver with it."""
    closed: list[GuardedResolver] = []
    original = GuardedResolver.close

    async def spy(self: GuardedResolver) -> None:
        closed.append(self)
        await original(self)

    monkeypatch.setattr(GuardedResolver, "close", spy)
    connector = guarded_connector(False)
    async with aiohttp.ClientSession(connector=connector):
        pass
    assert connector.closed
    assert len(closed) == 1


# ---------------------------------------------------------------- through aiohttp, on loopback


@asynccontextmanager
async def receiver(
    status: int = 200, location: str | None = None
) -> AsyncIterator[tuple[TestServer, list[str]]]:
    """An aiohttp server on 127.0.0.1 that records the path of every request it gets."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.path)
        headers = {"Location": location} if location else None
        return web.Response(status=status, text="ok", headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    async with server:
        yield server, seen


async def post(
    connector: aiohttp.BaseConnector, url: str, *, allow_redirects: bool = False
) -> tuple[int, Sequence[str]]:
    """Send like the dispatcher: one POST, redirects off unless a test turns them on."""
    async with (
        aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as session,
        session.post(url, json={"event": "x"}, allow_redirects=allow_redirects) as resp,
    ):
        await resp.read()
        return resp.status, [str(r.url) for r in resp.history]


async def test_guarded_connector_blocks_an_ip_literal_loopback_receiver() -> None:
    """http://127.0.0.1:<port>/ fails with BlockedAddress and the receiver sees nothing."""
    async with receiver() as (server, seen):
        url = f"http://127.0.0.1:{server.port}/hook"
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await post(guarded_connector(allow_private=False), url)
    assert isinstance(caught.value.os_error, BlockedAddress)
    assert caught.value.os_error.reason == "loopback"
    assert "blocked by the SSRF guard" in str(caught.value)
    assert seen == []


async def test_guarded_connector_blocks_a_name_resolving_to_loopback() -> None:
    """http://localhost:<port>/ is refused at resolve time and the receiver sees nothing."""
    async with receiver() as (server, seen):
        url = f"http://localhost:{server.port}/hook"
        with pytest.raises(aiohttp.ClientConnectorDNSError) as caught:
            await post(guarded_connector(allow_private=False), url)
    assert isinstance(caught.value.os_error, BlockedAddress)
    assert caught.value.os_error.reason == "loopback"
    assert seen == []


async def test_guarded_connector_blocks_a_rebound_name() -> None:
    """A name that passed check_url but resolves to loopback at connect time is blocked."""
    check_url("http://hooks.customer.example/hook", require_https=False)
    async with receiver() as (server, seen):
        fake = FakeResolver({"hooks.customer.example": [["127.0.0.1"]]})
        connector = guarded_connector(allow_private=False, inner_resolver=fake)
        url = f"http://hooks.customer.example:{server.port}/hook"
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await post(connector, url)
    assert isinstance(caught.value.os_error, BlockedAddress)
    assert fake.calls == ["hooks.customer.example"]
    assert seen == []


async def test_guarded_connector_allow_private_reaches_loopback() -> None:
    """With allow_private=True (dev/tests) the same loopback receiver gets the request."""
    async with receiver() as (server, seen):
        for host in ("127.0.0.1", "localhost"):
            status, _ = await post(
                guarded_connector(allow_private=True), f"http://{host}:{server.port}/hook"
            )
            assert status == 200
    assert seen == ["/hook", "/hook"]


async def test_resolver_alone_misses_ip_literals() -> None:
    """aiohttp skips the resolver for IP-literal hosts, which is why guarded_socket exists."""
    async with receiver() as (server, seen):
        guard = GuardedResolver(allow_private=False)
        connector = aiohttp.TCPConnector(resolver=guard)
        status, _ = await post(connector, f"http://127.0.0.1:{server.port}/hook")
        await guard.close()
    assert status == 200
    assert seen == ["/hook"]


async def test_redirect_to_loopback_is_not_followed() -> None:
    """A 302 to another loopback server comes back to the client; the second server sees nothing."""
    async with receiver() as (inner, inner_seen):
        target = f"http://127.0.0.1:{inner.port}/internal"
        async with receiver(status=302, location=target) as (outer, outer_seen):
            url = f"http://127.0.0.1:{outer.port}/hook"
            status, history = await post(guarded_connector(allow_private=True), url)
    assert status == 302
    assert history == []
    assert outer_seen == ["/hook"]
    assert inner_seen == []


async def test_redirect_test_setup_would_follow_if_redirects_were_on() -> None:
    """Control: with allow_redirects=True the same setup does reach the second server."""
    async with receiver() as (inner, inner_seen):
        target = f"http://127.0.0.1:{inner.port}/internal"
        async with receiver(status=302, location=target) as (outer, _):
            url = f"http://127.0.0.1:{outer.port}/hook"
            status, history = await post(
                guarded_connector(allow_private=True), url, allow_redirects=True
            )
    assert status == 200
    assert len(history) == 1
    assert inner_seen == ["/internal"]


async def test_dispatcher_pattern_blocks_both_the_receiver_and_the_redirect() -> None:
    """allow_redirects=False + guarded connector: neither the 302 server nor its target is hit."""
    async with receiver() as (inner, inner_seen):
        target = f"http://127.0.0.1:{inner.port}/internal"
        async with receiver(status=302, location=target) as (outer, outer_seen):
            for host in ("127.0.0.1", "localhost"):
                with pytest.raises(aiohttp.ClientConnectorError) as caught:
                    await post(guarded_connector(False), f"http://{host}:{outer.port}/hook")
                assert isinstance(caught.value.os_error, BlockedAddress)
            # The redirect target itself, had a redirect been followed, is blocked the same way.
            with pytest.raises(aiohttp.ClientConnectorError) as caught:
                await post(guarded_connector(False), target)
            assert isinstance(caught.value.os_error, BlockedAddress)
    assert outer_seen == []
    assert inner_seen == []
