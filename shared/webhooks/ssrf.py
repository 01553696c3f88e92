"""SSRF guard for outbound webhooks: URL checks at registration, address checks at connect time.

It must never let a request reach a non-public address unless `allow_private=True` (tests, dev).
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import urllib.parse
from typing import Any

import aiohttp
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

INVALID_WEBHOOK_URL = "invalid_webhook_url"
MAX_URL_LENGTH = 2048

# First match wins, so the narrower networks come before the wider ones that contain them.
_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
_IPV4_TABLE: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/32"), "unspecified"),
    (_V4("0.0.0.0/8"), "this_network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "cgnat"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link_local"),  # includes cloud metadata 169.254.169.254
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "reserved"),  # IETF protocol assignments (DS-Lite, NAT64 discovery)
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.88.99.0/24"), "6to4"),  # 6to4 relay anycast
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("240.0.0.0/4"), "reserved"),
)
_IPV6_TABLE: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("64:ff9b::/96"), "nat64"),  # NAT64 well-known prefix: reaches any IPv4, even 127/8
    (_V6("64:ff9b:1::/48"), "nat64"),  # NAT64 local-use prefix
    (_V6("::/8"), "reserved"),  # the rest of it, once embedded IPv4 forms are unwrapped
    (_V6("100::/64"), "discard"),
    (_V6("2001::/32"), "teredo"),
    (_V6("2001:2::/48"), "benchmarking"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("2001::/23"), "reserved"),  # IETF protocol assignments
    (_V6("2002::/16"), "6to4"),
    (_V6("3fff::/20"), "documentation"),
    (_V6("5f00::/16"), "reserved"),  # SRv6 SIDs
    (_V6("fc00::/7"), "private"),  # unique local
    (_V6("fe80::/10"), "link_local"),
    (_V6("fec0::/10"), "site_local"),
    (_V6("ff00::/8"), "multicast"),
)
_GLOBAL_UNICAST_V6 = _V6("2000::/3")
# Python 3.11's ipaddress reports these as global, so they are listed above explicitly;
# these other IPv6 forms carry an IPv4 address in their low 32 bits and are unwrapped first.
_IPV4_COMPATIBLE_HIGH = 0  # ::a.b.c.d (deprecated, RFC 4291 2.5.5.1)
_IPV4_TRANSLATED_HIGH = 0xFFFF0000  # ::ffff:0:a.b.c.d (SIIT, RFC 2765)

_SPECIAL_USE_SUFFIXES = ("localhost", "local", "internal", "localdomain", "home.arpa")
_HOSTNAME_RE = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*\.?")
_HEX_PART_RE = re.compile(r"0[xX][0-9a-fA-F]*")
_OCTAL_PART_RE = re.compile(r"0[0-7]*")
_DECIMAL_PART_RE = re.compile(r"[1-9][0-9]*")


def _table_reason(addr: IPAddress) -> str | None:
    if isinstance(addr, ipaddress.IPv4Address):
        for net4, reason in _IPV4_TABLE:
            if addr in net4:
                return reason
        return None if addr.is_global else "reserved"
    for net6, reason in _IPV6_TABLE:
        if addr in net6:
            return reason
    if addr not in _GLOBAL_UNICAST_V6 or not addr.is_global:
        return "reserved"
    return None


def address_problem(ip: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why `ip` must not be a webhook target (a short reason code), or None if it is global.

    IPv4 embedded in IPv6 is unwrapped first: `::ffff:a.b.c.d` answers for the IPv4 address
    (`ipv4_mapped:<reason>`); the deprecated IPv4-compatible and SIIT-translated forms are
    always refused. A string that is not an IP address raises ValueError.
    """
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if isinstance(addr, ipaddress.IPv6Address):
        mapped = addr.ipv4_mapped
        if mapped is not None:
            inner = _table_reason(mapped)
            return None if inner is None else f"ipv4_mapped:{inner}"
        value = int(addr)
        high, low = value >> 32, ipaddress.IPv4Address(value & 0xFFFFFFFF)
        if high == _IPV4_COMPATIBLE_HIGH and value > 1:
            inner = _table_reason(low)
            return "ipv4_compatible" if inner is None else f"ipv4_compatible:{inner}"
        if high == _IPV4_TRANSLATED_HIGH:
            inner = _table_reason(low)
            return "ipv4_translated" if inner is None else f"ipv4_translated:{inner}"
    return _table_reason(addr)


class UrlRejected(ValueError):
    """A webhook URL that fails the SSRF checks; `code` is the stable API error code."""

    code: str = INVALID_WEBHOOK_URL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def parse_legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """Read `text` the way inet_aton does (1-4 parts, each decimal, 0-octal or 0x-hex).

    `2130706433`, `0x7f.1` and `017700000001` are all 127.0.0.1; None if it is not an address.
    """
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        if _HEX_PART_RE.fullmatch(part):
            values.append(int(part[2:] or "0", 16))
        elif _OCTAL_PART_RE.fullmatch(part):
            values.append(int(part, 8))
        elif _DECIMAL_PART_RE.fullmatch(part):
            values.append(int(part))
        else:
            return None
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    value = last
    for i, v in enumerate(head):
        value |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def _ends_in_number(host: str) -> bool:
    """WHATWG URL rule: a host whose last label is numeric is an IPv4 address or invalid."""
    last = host.removesuffix(".").rsplit(".", 1)[-1]
    return last.isascii() and (last.isdigit() or bool(_HEX_PART_RE.fullmatch(last)))


def _literal_address(host: str) -> IPAddress | None:
    """The address an IP-literal host denotes, None for a name; UrlRejected if malformed."""
    if ":" in host:
        if "%" in host:
            raise UrlRejected(f"host [{host}] has an IPv6 zone identifier, which is not allowed")
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            raise UrlRejected(f"host [{host}] is not a valid IPv6 address") from None
    if not _ends_in_number(host):
        return None
    legacy = parse_legacy_ipv4(host.removesuffix("."))
    if legacy is None:
        raise UrlRejected(f"host {host!r} ends in a number but is not a valid IPv4 address")
    if str(legacy) != host:
        # aiohttp refuses these forms too; name the address so the rejection is clear.
        problem = address_problem(legacy)
        detail = f"{legacy}" if problem is None else f"{legacy}, {problem}"
        raise UrlRejected(
            f"host {host!r} is a non-canonical IPv4 literal ({detail}); "
            "write the address in dotted-decimal form"
        )
    return legacy


def _check_name(host: str, allow_private: bool) -> None:
    if len(host) > 253 or not _HOSTNAME_RE.fullmatch(host):
        raise UrlRejected(f"host {host!r} is not a valid hostname")
    if allow_private:
        return
    name = host.removesuffix(".")
    for suffix in _SPECIAL_USE_SUFFIXES:
        if name == suffix or name.endswith("." + suffix):
            raise UrlRejected(f"host {host!r} is a local-only name (.{suffix})")
    if "." not in name:
        raise UrlRejected(
            f"host {host!r} is a single-label name, resolved through local search "
            "domains (cluster-internal services); use a fully qualified name"
        )


def _check_host(host: str, allow_private: bool) -> None:
    """Check one lowercase ASCII host as written in a URL; raise UrlRejected if refused."""
    addr = _literal_address(host)
    if addr is None:
        _check_name(host, allow_private)
        return
    if not allow_private:
        problem = address_problem(addr)
        if problem is not None:
            shown = f"[{host}]" if ":" in host else host
            raise UrlRejected(f"host {shown} is not a publicly routable address ({problem})")


def _same_host(a: str, b: str) -> bool:
    if ":" not in b:
        return a == b
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def check_url(
    url: str, allow_private: bool = False, require_https: bool = True
) -> urllib.parse.SplitResult:
    """Syntactic SSRF checks for a webhook URL at registration; raises UrlRejected.

    https only (http too when `require_https=False`), a host, no userinfo, a port in 1-65535,
    at most MAX_URL_LENGTH characters. IP-literal hosts (dotted, bracketed IPv6, and the
    decimal/octal/hex IPv4 forms a resolver would accept) and local-only names (localhost,
    *.local, *.internal, single-label names) are refused unless `allow_private`. The host is
    read both by urllib and by yarl (the parser aiohttp connects with); both must agree.
    Names are only resolved at connect time (GuardedResolver), which is the check that counts.
    """
    if len(url) > MAX_URL_LENGTH:
        raise UrlRejected(f"URL is {len(url)} characters long; the limit is {MAX_URL_LENGTH}")
    bad = next((c for c in url if c <= " " or c in {"\x7f", "\\"}), None)
    if bad is not None:
        raise UrlRejected(
            f"URL contains {bad!r}; whitespace, control characters and backslashes are not allowed"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRejected(f"URL does not parse: {exc}") from None
    allowed = ("https",) if require_https else ("http", "https")
    scheme = parts.scheme.lower()
    if scheme not in allowed:
        raise UrlRejected(f"URL scheme must be {' or '.join(allowed)}, not {scheme or 'missing'!r}")
    if "@" in parts.netloc:
        raise UrlRejected("URL must not contain userinfo (user:password@)")
    if port == 0:
        raise UrlRejected("URL port must be in 1-65535")
    split_host = parts.hostname
    if not split_host:
        raise UrlRejected("URL has no host")
    try:
        parsed = yarl.URL(url)
    except ValueError as exc:
        raise UrlRejected(f"URL does not parse: {exc}") from None
    host = parsed.raw_host  # what aiohttp resolves and connects to: lowercase, IDNA-encoded
    if not host or parsed.explicit_port != port or parsed.user is not None:
        raise UrlRejected(
            "URL is ambiguous: its host or port reads differently to different parsers"
        )
    if "[" in parts.netloc and ":" not in host:
        raise UrlRejected(f"bracketed host [{host}] is not an IPv6 address")
    _check_host(host, allow_private)
    if split_host.isascii() and not _same_host(split_host, host):
        raise UrlRejected(f"URL is ambiguous: its host reads as {split_host!r} and as {host!r}")
    return parts


class BlockedAddress(OSError):
    """A connect target that is not publicly routable; aiohttp wraps it in ClientConnectorError.

    Its message never names the address a name resolved to, nor why that address is refused:
    echoed to a client, either would make the guard a DNS oracle for internal names (what
    `db.internal.corp` resolves to). `address` and `reason` are for the operator's log."""

    def __init__(self, host: str, address: str, reason: str) -> None:
        if host == address:
            message = f"{address} is not publicly routable ({reason}); blocked by the SSRF guard"
        else:
            message = (
                f"{host!r} resolves to an address that is not publicly routable; "
                "blocked by the SSRF guard"
            )
        super().__init__(errno.EACCES, message)
        self.host = host
        self.address = address
        self.reason = reason


def _raise_if_blocked(host: str, address: str) -> None:
    try:
        problem = address_problem(address)
    except ValueError:
        problem = "unparseable"
    if problem is not None:
        raise BlockedAddress(host, address, problem)


async def resolve_checked(
    host: str,
    port: int,
    allow_private: bool,
    resolver: AbstractResolver | None = None,
    *,
    family: socket.AddressFamily = socket.AF_UNSPEC,
) -> list[ResolveResult]:
    """Resolve `host` (A and AAAA by default) and raise BlockedAddress if ANY address is blocked.

    Uses `resolver`, or aiohttp's default resolver (created and closed here) when None.
    An empty answer raises socket.gaierror, so a caller never gets an empty list.
    """
    inner = resolver if resolver is not None else DefaultResolver()
    try:
        results = await inner.resolve(host, port, family=family)
    finally:
        if resolver is None:
            await inner.close()
    if not results:
        raise socket.gaierror(socket.EAI_NONAME, f"{host!r} resolved to no addresses")
    if not allow_private:
        for result in results:
            _raise_if_blocked(host, result["host"])
    return results


class GuardedResolver(AbstractResolver):
    """aiohttp resolver that refuses (BlockedAddress) any name resolving to a blocked address.

    Every connect resolves through it, so a DNS answer that changes after registration
    (rebinding) is checked again. It never sees IP-literal hosts: aiohttp skips the resolver
    for those, which `guarded_socket` (installed by `guarded_connector`) covers.
    """

    def __init__(
        self, allow_private: bool = False, resolver: AbstractResolver | None = None
    ) -> None:
        self.allow_private = allow_private
        self._owns_inner = resolver is None
        self._inner: AbstractResolver = resolver if resolver is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return await resolve_checked(host, port, self.allow_private, self._inner, family=family)

    async def close(self) -> None:
        """Close the wrapped resolver if this guard created it."""
        if self._owns_inner:
            await self._inner.close()


def guarded_socket(addr_info: aiohttp.AddrInfoType) -> socket.socket:
    """aiohttp socket factory that refuses to create a socket towards a blocked address.

    The last check before connect(): it also sees IP-literal hosts, which bypass the resolver.
    """
    family, type_, proto, _, sockaddr = addr_info
    address = str(sockaddr[0])
    _raise_if_blocked(address, address)
    return socket.socket(family=family, type=type_, proto=proto)


class _GuardedConnector(aiohttp.TCPConnector):
    """TCPConnector that owns its GuardedResolver and closes it with itself."""

    def __init__(self, guard: GuardedResolver, **kw: Any) -> None:
        self._guard = guard
        super().__init__(
            resolver=guard,
            socket_factory=None if guard.allow_private else guarded_socket,
            **kw,
        )

    async def close(self, *, abort_ssl: bool = False) -> None:
        try:
            await super().close(abort_ssl=abort_ssl)
        finally:
            await self._guard.close()


def guarded_connector(
    allow_private: bool, *, inner_resolver: AbstractResolver | None = None, **kw: Any
) -> aiohttp.TCPConnector:
    """A TCPConnector for webhook delivery: every connect is checked against the SSRF policy.

    Names go through GuardedResolver and every socket through `guarded_socket`. Send with
    `allow_redirects=False` (a redirect is a new, unchecked URL) and without a proxy (the
    guard would check the proxy's address, not the target's). The DNS cache is safe: entries
    were checked when resolved and connections go to exactly those addresses; its short TTL
    only keeps up with receivers that move. `inner_resolver` replaces aiohttp's default
    resolver under the guard (the caller closes it); `kw` goes to TCPConnector (limits, ssl).
    """
    for reserved in ("resolver", "socket_factory"):
        if reserved in kw:
            raise TypeError(f"guarded_connector() sets {reserved!r} itself")
    kw.setdefault("limit", 100)
    kw.setdefault("limit_per_host", 4)
    kw.setdefault("ttl_dns_cache", 10)
    return _GuardedConnector(GuardedResolver(allow_private, inner_resolver), **kw)
