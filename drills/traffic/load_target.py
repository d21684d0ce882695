"""Where load may go: the one check of a load target, before anything is started.

On the embedded cluster only 127.0.0.0/8 (the mesh emulator drills started); against a live cluster the stage
service's URL the user names, never a cloud metadata service, a link-local address or the API server itself.  A name
is resolved to check it; nothing is sent.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


class LoadRefused(ValueError):
    """The load target or its bounds are refused; nothing was started."""


def check_target(url: str, target: str = "embedded") -> str:
    """Return the URL when load may be sent to it; raise LoadRefused otherwise.

    embedded: the host must be an IPv4 literal in 127.0.0.0/8, or a name that resolves only to such addresses.
    kubeconfig (live): an http(s) URL given on the command line.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LoadRefused(f"load target {url!r} is not an http(s) URL")
    if target != "embedded":
        return url
    loop = ipaddress.ip_network("127.0.0.0/8")
    host = parts.hostname
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        if literal.version != 4 or literal not in loop:
            raise LoadRefused(f"refusing load to {url}: {host} is outside 127.0.0.0/8; on the embedded cluster "
                              f"load only goes to loopback addresses the drill started")
        return url
    try:
        addrs = {ipaddress.ip_address(ai[4][0]) for ai in socket.getaddrinfo(host, None)}
    except OSError:
        addrs = set()
    v4 = [a for a in addrs if a.version == 4]
    if not v4 or any(a not in loop for a in v4) or any(not a.is_loopback for a in addrs):
        raise LoadRefused(f"refusing load to {url}: {host!r} resolves to "
                          f"{', '.join(sorted(map(str, addrs))) or 'nothing'}, not only to 127.0.0.0/8; on the "
                          f"embedded cluster load only goes to loopback addresses the drill started")
    return url


# cloud metadata services (credentials live there) and the API server's in-cluster names: never a load target
METADATA_NAMES = ("metadata", "metadata.google.internal", "metadata.goog", "instance-data",
                  "instance-data.ec2.internal", "metadata.azure.com", "metadata.tencentyun.com")
API_SERVER_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
METADATA_ADDRESSES = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"),
                      ipaddress.ip_network("fd00:ec2::254/128"), ipaddress.ip_network("100.100.100.200/32"),
                      ipaddress.ip_network("192.0.0.192/32"))


def _addresses(host: str) -> set:
    """Every address ``host`` stands for: a literal (the shorthand forms too: 2852039166, 0xa9.0xfe.0xa9.0xfe), else
    what it resolves to (empty when it does not resolve here)."""
    bare = host.split("%", 1)[0]
    try:
        return {ipaddress.ip_address(bare)}
    except ValueError:
        pass
    try:
        return {ipaddress.ip_address(socket.inet_aton(bare))}
    except OSError:
        pass
    try:
        return {ipaddress.ip_address(ai[4][0].split("%", 1)[0]) for ai in socket.getaddrinfo(bare, None)}
    except (OSError, UnicodeError, ValueError):
        return set()


def _port(parts) -> int | None:
    try:
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


def check_live_target(url: str, api_server: str | None = None) -> str:
    """The live --service-url: an http(s) URL that is neither the API server's own address (the load would go to
    the control plane) nor a link-local or cloud metadata address (169.254.0.0/16, fe80::/10, fd00:ec2::254, ...).
    LoadRefused otherwise; nothing is sent to check it (a name is resolved, nothing more)."""
    check_target(url, target="live")
    parts = urlsplit(url)
    try:
        parts.port
    except ValueError:
        raise LoadRefused(f"load target {url!r}: not a valid port") from None
    host = (parts.hostname or "").rstrip(".").lower()
    if host in METADATA_NAMES:
        raise LoadRefused(f"refusing load to {url}: {host} is a cloud metadata service")
    if host in API_SERVER_NAMES:
        raise LoadRefused(f"refusing load to {url}: {host} is the API server's in-cluster name")
    addrs = _addresses(host)
    for a in addrs:
        a4 = a.ipv4_mapped if a.version == 6 and a.ipv4_mapped else a
        if any(a4 in net for net in METADATA_ADDRESSES if net.version == a4.version) or a4.is_link_local:
            raise LoadRefused(f"refusing load to {url}: {host} is a link-local or cloud metadata address ({a})")
        if a4.is_unspecified or a4.is_multicast:
            raise LoadRefused(f"refusing load to {url}: {a} is not a service address")
    if api_server:
        api = urlsplit(api_server)
        api_host = (api.hostname or "").rstrip(".").lower()
        api_addrs = _addresses(api_host)
        loopback = bool(addrs) and bool(api_addrs) and all(a.is_loopback for a in addrs | api_addrs)
        same_host = host == api_host or bool(addrs & api_addrs) or loopback
        if same_host and _port(parts) == _port(api):
            raise LoadRefused(f"refusing load to {url}: it is the API server's own address ({api_server}); give "
                              f"the stage service's URL")
    return url
