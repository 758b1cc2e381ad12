"""Who may use the web console, and CSRF protection of its actions.

* Credentials come from the settings: ``web_username`` + ``web_password`` (HTTP basic: a
  browser asks for them) and/or ``web_token`` (``Authorization: Bearer <token>``); the secrets
  are ``SecretStr``, compared in constant time and never logged or shown.
* An action (a POST) always needs credentials; pages need them too when the console listens
  beyond loopback (:func:`check_bind` refuses such a bind without credentials, and refuses
  ``--allow-actions`` without them anywhere).
* CSRF: a page that shows action controls sets a random token in a ``SameSite=Strict``,
  ``HttpOnly`` cookie (``Secure`` when the request came over HTTPS) and in each form; a POST is
  refused (403) unless the form's token equals the cookie's, and unless its ``Origin`` (when
  the browser sends one) is this console's.
* Transport: beyond loopback credentials must not travel in clear, so the console serves TLS
  itself (a certificate and key) or is told it sits behind a TLS-terminating proxy
  (:class:`Transport`); :func:`check_bind` refuses anything else. Over HTTPS every response
  carries ``Strict-Transport-Security`` (:class:`HstsMiddleware`). Behind a proxy the
  ``X-Forwarded-Proto``/``-For`` headers are honoured from the listed proxy addresses only
  (uvicorn's proxy headers, off otherwise): a client cannot claim HTTPS or another address.

Failure behaviour: missing or wrong credentials: 401 with a ``WWW-Authenticate: Basic``
challenge; a failed CSRF check: 403, nothing done.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import secrets
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runner.config import Settings
from runner.errors import ConfigError

CSRF_COOKIE = "latchwork_csrf"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None

    @classmethod
    def of(cls, settings: Settings) -> Credentials:
        return cls(settings.web_username, settings.web_password, settings.web_token)

    @property
    def configured(self) -> bool:
        return (self.username is not None and self.password is not None) \
            or self.token is not None

    def accepts(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials."""
        if not header or not self.configured:
            return False
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return hmac.compare_digest(value.strip().encode(),
                                       self.token.get_secret_value().encode())
        if scheme.lower() == "basic" and self.username is not None \
                and self.password is not None:
            try:
                user, _, password = base64.b64decode(value.strip()).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return hmac.compare_digest(user.encode(), self.username.encode()) & \
                hmac.compare_digest(password.encode(),
                                    self.password.get_secret_value().encode())
        return False


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: how long before its end a certificate is warned of in the log
EXPIRY_WARNING = timedelta(days=14)


@dataclass(frozen=True)
class Transport:
    """How requests reach the console: TLS of its own (``cert`` + ``key``), or behind a proxy
    that terminates it (whose ``X-Forwarded-*`` headers are honoured from ``proxies`` only),
    or neither (plain HTTP: loopback only)."""

    cert: Path | None = None
    key: Path | None = None
    behind_proxy: bool = False
    proxies: tuple[str, ...] = ("127.0.0.1",)

    @classmethod
    def of(cls, settings: Settings) -> Transport:
        return cls(settings.web_tls_cert, settings.web_tls_key, settings.web_behind_proxy,
                   tuple(settings.web_proxies))

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def check(self) -> None:
        """A certificate needs its key and both must be readable files
        (:class:`ConfigError`); listed proxies must be addresses or networks."""
        if (self.cert is None) != (self.key is None):
            raise ConfigError("--tls-cert and --tls-key go together (web_tls_cert and "
                              "web_tls_key)")
        if self.cert is not None and self.key is not None:
            for what, path in (("--tls-cert", self.cert), ("--tls-key", self.key)):
                if path.is_dir():
                    raise ConfigError(f"latchwork web: {what} {path} is a directory, not a "
                                      "PEM file")
            try:  # what uvicorn will load: a bad pair is one line now, not a traceback later
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                    self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"latchwork web: cannot use the TLS certificate {self.cert} "
                                  f"with the key {self.key}: {exc}") from None
            self.check_dates()
        for proxy in self.proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ConfigError(f"--proxy {proxy!r} is not an address or a network") from None

    def validity(self) -> tuple[datetime, datetime]:
        """(not before, not after) of the served certificate (the first of its chain), UTC."""
        from cryptography import x509

        assert self.cert is not None
        try:
            cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"latchwork web: cannot read the TLS certificate {self.cert}: "
                              f"{exc}") from None
        return cert.not_valid_before_utc, cert.not_valid_after_utc

    def check_dates(self, now: datetime | None = None) -> None:
        """An expired certificate, or one not valid yet, is refused in one line naming its
        dates (clients would fail with "certificate has expired", and the console say
        nothing)."""
        now = now or datetime.now(UTC)
        start, end = self.validity()
        dates = f"valid from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
        if now > end:
            raise ConfigError(f"latchwork web: the TLS certificate {self.cert} expired on "
                              f"{end:%Y-%m-%d %H:%M} UTC ({dates}): renew it")
        if now < start:
            raise ConfigError(f"latchwork web: the TLS certificate {self.cert} is not valid "
                              f"before {start:%Y-%m-%d %H:%M} UTC ({dates}): check the "
                              "clock, or the certificate")

    def expiry_warning(self, now: datetime | None = None) -> str | None:
        """A warning when the certificate expires within :data:`EXPIRY_WARNING` (None
        otherwise, and without TLS)."""
        if self.cert is None:
            return None
        _, end = self.validity()
        left = end - (now or datetime.now(UTC))
        if left > EXPIRY_WARNING:
            return None
        return (f"the TLS certificate {self.cert} expires on {end:%Y-%m-%d %H:%M} UTC, in "
                f"{left.days} day(s) {left.seconds // 3600} h: renew it before then")


def check_bind(host: str, credentials: Credentials, allow_actions: bool,
               transport: Transport | None = None) -> None:
    """Refuse what would expose the console: a non-loopback address, or actions, without
    credentials configured; a non-loopback address without TLS or a TLS-terminating proxy
    in front (credentials would travel in clear). :class:`ConfigError`, the CLI's exit 2."""
    transport = transport or Transport()
    transport.check()
    if not credentials.configured and not is_loopback(host):
        raise ConfigError(f"latchwork web refuses to listen on {host} without credentials: "
                          "set web_username and web_password, or web_token")
    if allow_actions and not credentials.configured:
        raise ConfigError("--allow-actions needs credentials: set web_username and "
                          "web_password, or web_token")
    if not is_loopback(host) and not transport.tls and not transport.behind_proxy:
        raise ConfigError(f"latchwork web refuses to serve credentials in clear on {host}: "
                          "give --tls-cert and --tls-key, or --behind-proxy when a "
                          "TLS-terminating proxy fronts it")


#: a year, the usual HSTS lifetime
HSTS = "max-age=31536000"


class HstsMiddleware:
    """Adds ``Strict-Transport-Security`` to every response of a request that came over HTTPS
    (the console's own TLS, or a trusted proxy's ``X-Forwarded-Proto: https``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_with_hsts(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append("Strict-Transport-Security", HSTS)
            await send(message)
        await self.app(scope, receive, send_with_hsts)


def challenge() -> Response:
    return PlainTextResponse("credentials needed", status_code=401,
                             headers={"WWW-Authenticate": 'Basic realm="latchwork"'})


def csrf_token(request: Request) -> str:
    """The token of this browser (its cookie's), or a new one (set by :func:`keep_token`)."""
    token = request.cookies.get(CSRF_COOKIE)
    if token and len(token) == 43:
        return token
    found: str | None = getattr(request.state, "csrf", None)
    if found is None:
        found = request.state.csrf = secrets.token_urlsafe(32)
    return found


def keep_token(request: Request, response: Response) -> Response:
    """Set the CSRF cookie when this request made a new token."""
    made = getattr(request.state, "csrf", None)
    if made is not None:
        response.set_cookie(CSRF_COOKIE, made, httponly=True, samesite="strict",
                            path="/", secure=request.url.scheme == "https")
    return response


def csrf_ok(request: Request, form_token: str | None) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not form_token or not hmac.compare_digest(cookie, form_token):
        return False
    origin = request.headers.get("origin")
    if origin and origin != "null":
        return urlsplit(origin).netloc == request.headers.get("host", "")
    return True
