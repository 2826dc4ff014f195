"""Where request images come from: data: URLs always; http(s) URLs only from allow-listed domains.

Remote fetches are off by default. When on, they guard against SSRF: the host must be on the allow-list,
every address it resolves to must be public, redirects are not followed, and size and time are bounded.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import urlsplit

from service.engine.errors import APIError
from service.engine.images import ImageLimits, PreparedImage, decode_data_url, prepare

FETCH_TIMEOUT_S = 5.0


def limits_by_detail(settings) -> dict[str, ImageLimits]:
    """The image limits for each OpenAI ``detail`` (auto, low, high): the same guards, a different long side."""
    auto = ImageLimits(settings.max_image_bytes, settings.max_image_pixels, settings.image_max_side)
    return {"auto": auto, "low": replace(auto, max_side=settings.image_max_side_low),
            "high": replace(auto, max_side=settings.image_max_side_high)}


def loader(settings) -> Callable[[str, str, str | None], PreparedImage]:
    """``load_image(url, param, detail)`` as the service applies it to every image_url of a request."""
    limits, domains = limits_by_detail(settings), settings.image_url_domains
    return lambda url, param, detail=None: load(url, param, limits[detail or "auto"], domains)


def load(url: str, param: str, limits: ImageLimits, allowed_domains: tuple[str, ...]) -> PreparedImage:
    if url.startswith("data:"):
        return prepare(decode_data_url(url, param), limits, param)
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as e:  # "http://[": urllib refuses what is not a URL at all
        raise APIError(f"image_url is not a URL ({e})", param=param, code="invalid_image_url") from None
    if scheme not in ("http", "https"):
        raise APIError("image_url must be a data: URL (or an http(s) URL from an allowed domain)", param=param,
                       code="invalid_image_url")
    return prepare(fetch(url, param, limits.max_bytes, allowed_domains), limits, param)


def _domain_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    return any(host == d or host.endswith("." + d) for d in allowed)


def _public_address(host: str, port: int, param: str) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise APIError(f"image host {host} does not resolve", param=param, code="image_fetch_failed") from None
    addresses = {info[4][0] for info in infos}
    for address in addresses:
        ip = ipaddress.ip_address(address)
        if not ip.is_global:
            raise APIError(f"image host {host} resolves to a non-public address; refused", 403, param=param,
                           code="image_url_forbidden")
    return sorted(addresses)[0]


class _PinnedHTTPS(http.client.HTTPSConnection):
    """TLS to an address we already checked, verifying the certificate for the original host name."""

    def __init__(self, host: str, address: str, port: int):
        super().__init__(host, port, timeout=FETCH_TIMEOUT_S, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def fetch(url: str, param: str, max_bytes: int, allowed_domains: tuple[str, ...]) -> bytes:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not allowed_domains:
        raise APIError("image URLs are disabled on this server; send the image as a data: URL", 400, param=param,
                       code="image_url_disabled")
    if not _domain_allowed(host, allowed_domains):
        raise APIError(f"image URLs from {host or '(no host)'} are not allowed; send a data: URL", 403,
                       param=param, code="image_url_forbidden")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:  # a port out of range or not a number
        raise APIError(f"image_url has a bad port ({e})", param=param, code="invalid_image_url") from None
    address = _public_address(host, port, param)  # connect to the checked address: no DNS rebinding
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = _PinnedHTTPS(host, address, port)
    else:
        conn = http.client.HTTPConnection(address, port, timeout=FETCH_TIMEOUT_S)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("GET", target, headers={"Host": host})
        response = conn.getresponse()
        if response.status != 200:
            raise APIError(f"fetching the image gave HTTP {response.status} (redirects are not followed)",
                           param=param, code="image_fetch_failed")
        data = response.read(max_bytes + 1)
    except (OSError, http.client.HTTPException) as e:
        raise APIError(f"could not fetch the image: {e}", param=param, code="image_fetch_failed") from None
    finally:
        conn.close()
    if len(data) > max_bytes:
        raise APIError(f"image at URL is over the {max_bytes}-byte limit", 413, param=param, code="image_too_large")
    return data
