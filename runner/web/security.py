"""Who may use the web console, and CSRF protection of its actions.

* Credentials come from the settings: ``web_username`` + ``web_password`` (HTTP basic: a
  browser asks for them) and/or ``web_token`` (``Authorization: Bearer <token>``); the secrets
  are ``SecretStr``, compared in constant time and never logged or shown.
* An action (a POST) always needs credentials; pages need them too when the console listens
  beyond loopback (:func:`check_bind` refuses such a bind without credentials, and refuses
  ``--allow-actions`` without them anywhere).
* CSRF: a page that shows action controls sets a random token in a ``SameSite=Strict``,
  ``HttpOnly`` cookie and in each form; a POST is refused (403) unless the form's token equals
  the cookie's, and unless its ``Origin`` (when the browser sends one) is this console's.

Failure behaviour: missing or wrong credentials: 401 with a ``WWW-Authenticate: Basic``
challenge; a failed CSRF check: 403, nothing done.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

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


def check_bind(host: str, credentials: Credentials, allow_actions: bool) -> None:
    """Refuse what would expose the console: a non-loopback address, or actions, without
    credentials configured (:class:`ConfigError`, the CLI's exit 2)."""
    if not credentials.configured and not is_loopback(host):
        raise ConfigError(f"latchwork web refuses to listen on {host} without credentials: "
                          "set web_username and web_password, or web_token")
    if allow_actions and not credentials.configured:
        raise ConfigError("--allow-actions needs credentials: set web_username and "
                          "web_password, or web_token")


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
                            path="/")
    return response


def csrf_ok(request: Request, form_token: str | None) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not form_token or not hmac.compare_digest(cookie, form_token):
        return False
    origin = request.headers.get("origin")
    if origin and origin != "null":
        return urlsplit(origin).netloc == request.headers.get("host", "")
    return True
