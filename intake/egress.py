"""The one egress guard for every URL and host a tenant configures: destinations (base URLs, REST templates
and lookups), provider endpoints (OAuth token URLs, API bases, JWKS), IMAP hosts, S3 endpoints and SNS.

A tenant-set address may reach public addresses only, plus the networks the platform lists in
`MAILROOM_EGRESS_ALLOWED_NETWORKS` (comma-separated CIDRs; unset: loopback in development, nothing in
production; set, even to empty: exactly that list). Refused whatever the allow-list says: URLs with user
information, backslashes, whitespace, control characters or a fragment, other schemes, and the cloud metadata
service names. Refused unless allow-listed: loopback, link-local (169.254.169.254), RFC 1918, CGNAT
(100.64.0.0/10), unique-local (fc00::/7), unspecified, multicast and reserved addresses, the same embedded in
IPv6 (IPv4-mapped, 6to4, Teredo, NAT64), and ports other than the purpose's (80/443, 993/143 for IMAP).

Two layers:
- `check_url` / `check_host`: the syntax (parsed with urllib3's parser, which is what makes the request), the
  literal addresses and names, and with `resolve=True` every address the name resolves to. `resolve=False` is
  for save time: it never waits on DNS.
- At connect time, so that DNS rebinding cannot pass: `guarded_session()` is a `requests.Session` whose
  transport adapter resolves the name, checks every address and connects to the checked address (the name
  stays for SNI and certificate checks); redirects go through the same adapter. `open_connection` does the
  same for raw sockets (IMAP).

A refusal raises `EgressRefused` (a ValueError) whose text says what was refused and why; it names the host
and the address, never the whole URL (a query may carry a token).
"""

import ipaddress
import re
import socket
import sys
from dataclasses import dataclass
from functools import lru_cache

import requests
from django.conf import settings
from requests.adapters import DEFAULT_POOLBLOCK, HTTPAdapter
from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, LocationParseError, NameResolutionError, NewConnectionError
from urllib3.util import Url, parse_url

WEB_PORTS = (443, 80)
HTTPS_PORTS = (443,)
IMAP_PORTS = (993, 143)
WEB_SCHEMES = ("https", "http")
HTTPS_ONLY = ("https",)

SETTING = "MAILROOM_EGRESS_ALLOWED_NETWORKS"
ALLOWED = f"the platform allows only public addresses and {SETTING}"

# Cloud metadata services by name (their addresses are link-local, CGNAT or unique-local: refused anyway).
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.internal",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.ec2.internal",
        "metadata.azure.internal",
        "metadata.tencentyun.com",
        "metadata.platformequinix.com",
    }
)
LOCALHOST_NAMES = ("localhost", ".localhost")  # RFC 6761: always loopback
LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
HOST_NAME = re.compile(rf"(?=.{{1,253}}$){LABEL}(?:\.{LABEL})*")
CGNAT = ipaddress.ip_network("100.64.0.0/10")
UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
UNSAFE_CHARACTERS = re.compile(r"[\s\x00-\x1f\x7f]")


class EgressRefused(ValueError):
    """A tenant-configured URL or host the platform does not let us reach; the text says why."""


@dataclass(frozen=True)
class EgressPolicy:
    """What one kind of tenant-configured address may use: `purpose` names it in every refusal."""

    purpose: str
    ports: tuple[int, ...] = WEB_PORTS
    schemes: tuple[str, ...] = WEB_SCHEMES


# --- the allow-list ---------------------------------------------------------------------------------


def parse_networks(value) -> tuple:
    """The networks of a comma-separated CIDR list (or a list of them); ValueError names a bad entry."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    networks = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{SETTING}: {item!r} is not a network (write CIDRs such as 10.20.0.0/16)") from None
    return tuple(networks)


@lru_cache(maxsize=16)
def _networks_of(value: tuple) -> tuple:
    return parse_networks(value)


def allowed_networks() -> tuple:
    value = getattr(settings, SETTING, ())
    return _networks_of(tuple(value.split(",")) if isinstance(value, str) else tuple(value or ()))


def is_allow_listed(address) -> bool:
    address = _plain(address)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # ::ffff:10.1.2.3 is 10.1.2.3 on the wire
    return any(address.version == network.version and address in network for network in allowed_networks())


# --- addresses ----------------------------------------------------------------------------------------


def _plain(address):
    """An IPv6 address without its scope id (fe80::1%eth0), for comparisons."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        return ipaddress.IPv6Address(str(address).split("%")[0])
    return address


def _embedded_ipv4(address):
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo client, NAT64), else None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_problem(address) -> str | None:
    """What makes `address` not public ("a private address"), or None for a public one."""
    address = _plain(address)
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        problem = address_problem(embedded)
        return f"an IPv6 form of {embedded}, {problem}" if problem else None
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if address.version == 4 and address in CGNAT:
        return "a shared (CGNAT) address"
    if address.version == 6 and address in UNIQUE_LOCAL:
        return "a unique-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "not a public address"
    return None


def check_address(address, port: int, *, host: str, policy: EgressPolicy, literal: bool = False) -> None:
    """EgressRefused unless `address`:`port` may be reached for `policy` (public, or in the allow-list).
    `literal`: the host is the address itself (as written), not a name resolving to it."""
    if is_allow_listed(address):
        return
    problem = address_problem(address)
    if problem:
        what = f"{host} is {problem}" if literal else f"{host} resolves to {address}, {problem}"
        raise EgressRefused(f"{policy.purpose}: refused: {what}; {ALLOWED}")
    if port not in policy.ports:
        refuse_port(port, host=host, policy=policy)


def refuse_port(port: int, *, host: str, policy: EgressPolicy):
    raise EgressRefused(
        f"{policy.purpose}: refused: port {port} on {host}; the platform allows only port "
        f"{' or '.join(map(str, policy.ports))} outside {SETTING}"
    )


def literal_address(host: str):
    """The IP address `host` spells (dotted quad, IPv6 in brackets or not, and the legacy forms such as
    127.1 or 0x7f.1 that the resolver reads as addresses), else None. Never asks DNS."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if not re.fullmatch(r"[0-9a-fA-FxX.]+", host):
        return None
    try:
        info = socket.getaddrinfo(
            host, None, family=socket.AF_INET, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    except (socket.gaierror, UnicodeError):
        return None
    return ipaddress.ip_address(info[0][4][0]) if info else None


# --- names and URLs -----------------------------------------------------------------------------------


def _refuse(policy: EgressPolicy, what: str):
    raise EgressRefused(f"{policy.purpose}: refused: {what}")


def normalise_host(host: str, policy: EgressPolicy) -> str:
    """The host lower-cased without a trailing dot; EgressRefused for anything that is not a host name or IP."""
    host = str(host or "")
    if not host:
        _refuse(policy, "there is no host")
    if UNSAFE_CHARACTERS.search(host) or "\\" in host or "@" in host or "%" in host:
        _refuse(policy, "the host contains whitespace, a control character, a backslash, '@' or '%'")
    host = host.lower().rstrip(".")
    if host.startswith("["):
        if not host.endswith("]") or literal_address(host) is None:
            _refuse(policy, f"{host!r} is not an IPv6 address")
        return host
    if not host.isascii():
        _refuse(policy, f"write the host {host!r} in its xn-- (IDNA) form")
    if literal_address(host) is None and not HOST_NAME.fullmatch(host):
        _refuse(policy, f"{host!r} is not a host name")
    if host in METADATA_NAMES:
        _refuse(policy, f"{host} is a cloud metadata service name")
    return host


def check_host(
    host: str,
    port,
    *,
    purpose: str,
    ports: tuple[int, ...] = IMAP_PORTS,
    resolve: bool = True,
    policy: EgressPolicy | None = None,
) -> list:
    """Check a host and port (IMAP and every URL's authority). Returns the checked addresses (the resolved
    `getaddrinfo` entries with `resolve=True`). `resolve=False` (save time) never asks DNS: it checks the
    syntax, literal addresses, localhost and metadata names, and a port nothing could allow."""
    policy = policy or EgressPolicy(purpose=purpose, ports=ports)
    host = normalise_host(host, policy)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        _refuse(policy, f"{port!r} is not a port")
    literal = literal_address(host)
    if literal is not None:
        written = host.strip("[]")
        shown = written if written == str(literal) else f"{host} (that is {literal})"
        check_address(literal, port, host=shown, policy=policy, literal=True)
        if not resolve:
            return [literal]
    elif host == LOCALHOST_NAMES[0] or host.endswith(LOCALHOST_NAMES[1]):
        # Always loopback (RFC 6761): refused at save time already, without asking DNS.
        check_address(ipaddress.ip_address("127.0.0.1"), port, host=host, policy=policy)
        if not resolve:
            return []
    if not resolve:
        if port not in policy.ports and not allowed_networks():
            refuse_port(port, host=host, policy=policy)  # no address could allow it
        return []
    return resolve_checked(host, port, policy=policy)


def resolve_checked(host: str, port: int, *, policy: EgressPolicy) -> list:
    """Every `getaddrinfo` entry of `host`, each address checked: one refused address refuses the host."""
    entries = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    if not entries:
        raise socket.gaierror(socket.EAI_NONAME, f"{host} has no address")
    for entry in entries:
        check_address(ipaddress.ip_address(entry[4][0]), port, host=host, policy=policy)
    return entries


def check_url(
    url: str,
    *,
    purpose: str,
    ports: tuple[int, ...] = WEB_PORTS,
    schemes: tuple[str, ...] = WEB_SCHEMES,
    resolve: bool = True,
) -> Url:
    """The parsed URL (urllib3's `Url`), or EgressRefused. See `check_host` for `resolve` (with it, a name
    that does not resolve raises socket.gaierror, an OSError: a connection failure, not a refusal)."""
    policy = EgressPolicy(purpose=purpose, ports=ports, schemes=schemes)
    return check_url_for(url, policy=policy, resolve=resolve)


def check_url_for(url: str, *, policy: EgressPolicy, resolve: bool = True) -> Url:
    text = str(url or "")
    if UNSAFE_CHARACTERS.search(text):
        _refuse(policy, "the URL contains whitespace or a control character")
    if "\\" in text:
        _refuse(policy, "the URL contains a backslash")
    try:
        parsed = parse_url(text)
    except LocationParseError:
        _refuse(policy, "this is not a URL")
    scheme = (parsed.scheme or "").lower()
    if scheme not in policy.schemes:
        _refuse(policy, f"the URL must start with {' or '.join(s + '://' for s in policy.schemes)}")
    authority = text.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0] if "://" in text else ""
    if parsed.auth is not None or "@" in authority or "%5c" in authority.lower():
        _refuse(policy, "the URL carries user information (user@host); credentials belong in the credentials reference")
    if parsed.fragment is not None:
        _refuse(policy, "the URL has a fragment (#...)")
    if not parsed.host:
        _refuse(policy, "the URL has no host")
    port = parsed.port if parsed.port is not None else (443 if scheme == "https" else 80)
    check_host(parsed.host, port, purpose=policy.purpose, resolve=resolve, policy=policy)
    return parsed


def url_problem(
    url: str, *, purpose: str, ports: tuple[int, ...] = WEB_PORTS, schemes: tuple[str, ...] = WEB_SCHEMES
) -> str | None:
    """The save-time check (no DNS) as a message, or None: for model and settings validation."""
    try:
        check_url(url, purpose=purpose, ports=ports, schemes=schemes, resolve=False)
    except EgressRefused as exc:
        return str(exc)
    return None


def host_problem(host: str, port, *, purpose: str, ports: tuple[int, ...] = IMAP_PORTS) -> str | None:
    try:
        check_host(host, port, purpose=purpose, ports=ports, resolve=False)
    except EgressRefused as exc:
        return str(exc)
    return None


# --- connecting to the checked address -------------------------------------------------------------------


def open_connection(
    host: str, port: int, *, policy: EgressPolicy, timeout=None, source_address=None, socket_options=None
) -> socket.socket:
    """A TCP connection to a checked address of `host` (resolved here, at connect time, so that a name that
    changes its answer after the save-time check is still refused). `timeout`: seconds, None (blocking), or
    anything else for the socket default."""
    entries = resolve_checked(host, port, policy=policy)
    last_error: OSError | None = None
    for family, kind, proto, _, address in entries:
        sock = None
        try:
            sock = socket.socket(family, kind, proto)
            for option in socket_options or ():
                sock.setsockopt(*option)
            if timeout is None or isinstance(timeout, (int, float)):
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(address)
            return sock
        except OSError as exc:
            last_error = exc
            if sock is not None:
                sock.close()
    raise last_error or OSError(f"no address of {host} answered")


class _GuardedConnectionMixin:
    """A urllib3 connection that opens its socket through `open_connection` (one check per connection)."""

    def __init__(self, *args, egress_policy: EgressPolicy, **kwargs):
        self.egress_policy = egress_policy
        super().__init__(*args, **kwargs)

    def _new_conn(self) -> socket.socket:
        try:
            sock = open_connection(
                self.host,
                self.port,
                policy=self.egress_policy,
                timeout=self.timeout,
                source_address=self.source_address,
                socket_options=self.socket_options,
            )
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc
        sys.audit("http.client.connect", self, self.host, self.port)
        return sock


class GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    pass


class GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    pass


class GuardedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class GuardedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


class GuardedPoolManager(PoolManager):
    def __init__(self, *args, egress_policy: EgressPolicy, **kwargs):
        super().__init__(*args, **kwargs)
        self.egress_policy = egress_policy
        self.pool_classes_by_scheme = {"http": GuardedHTTPConnectionPool, "https": GuardedHTTPSConnectionPool}

    def _new_pool(self, scheme, host, port, request_context=None):
        # urllib3's documented customisation point: every connection of the pool gets the policy.
        pool = super()._new_pool(scheme, host, port, request_context)
        pool.conn_kw["egress_policy"] = self.egress_policy
        return pool


class GuardedAdapter(HTTPAdapter):
    """A transport adapter that checks each request's URL (redirects included) and connects only to checked
    addresses. No proxies (a proxy would connect on our behalf, unchecked); no automatic retries by default."""

    __attrs__ = [*HTTPAdapter.__attrs__, "egress_policy"]

    def __init__(self, *, policy: EgressPolicy, max_retries=0, **kwargs):
        self.egress_policy = policy
        super().__init__(max_retries=max_retries, **kwargs)

    def init_poolmanager(self, connections, maxsize, block=DEFAULT_POOLBLOCK, **pool_kwargs):
        self._pool_connections, self._pool_maxsize, self._pool_block = connections, maxsize, block
        self.poolmanager = GuardedPoolManager(
            num_pools=connections, maxsize=maxsize, block=block, egress_policy=self.egress_policy, **pool_kwargs
        )

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        raise EgressRefused(f"{self.egress_policy.purpose}: refused: requests through a proxy are not checked")

    def send(self, request, **kwargs):
        check_url_for(request.url, policy=self.egress_policy, resolve=False)
        return super().send(request, **kwargs)


def guarded_session(
    *, purpose: str, ports: tuple[int, ...] = WEB_PORTS, schemes: tuple[str, ...] = WEB_SCHEMES, max_retries=0
) -> requests.Session:
    """A `requests.Session` for tenant-configured URLs: every request and redirect through `GuardedAdapter`,
    nothing from the environment (`trust_env=False`: no proxies, no .netrc credentials)."""
    session = requests.Session()
    session.trust_env = False
    adapter = GuardedAdapter(
        policy=EgressPolicy(purpose=purpose, ports=ports, schemes=schemes), max_retries=max_retries
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
