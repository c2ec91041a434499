"""A zone at run time: its settings, who may connect and what they may do, its limits on this node, and
its telemetry. Channels hold their zone and pick up a live change at their next delivery
(Channel.apply_zone); the node updates zones in place when the config changes (`Zone.update`).
"""

from __future__ import annotations

from .auth import Acl, Authenticator, zone_users
from .authn.chain import Authenticator as ChainAuthenticator
from .authn.chain import Chain
from .authn.http import HttpAuthenticator
from .authn.jwt import JwtAuthenticator
from .config import ConfigError
from .limiter import TokenBucket
from .telemetry import Telemetry
from .zones import JwtAuthentication, ZoneSettings


class ConnectLimits:
    """This node's connections in a zone, and its connect-rate bucket."""

    __slots__ = ("_bucket", "connections", "rate")

    def __init__(self, rate: float) -> None:
        self.connections = 0
        self.rate = rate
        self._bucket: TokenBucket | None = None

    def connect_allowed(self, now: float) -> bool:
        if not self.rate:
            return True
        if self._bucket is None:
            self._bucket = TokenBucket(self.rate, now)  # on the channels' clock
        return not self._bucket.take(now)

    def set_rate(self, rate: float) -> None:
        self.rate = rate
        self._bucket = None


class Zone:
    __slots__ = ("acl", "auth", "authn", "limits", "name", "settings", "telemetry")

    def __init__(self, name: str, settings: ZoneSettings, telemetry: Telemetry) -> None:
        self.name = name
        self.telemetry = telemetry
        self.limits = ConnectLimits(settings.max_conn_rate)
        self.settings = settings
        self.acl, self.auth = self.access(settings)
        self.authn = self.chain(name, settings)

    @staticmethod
    def access(settings: ZoneSettings) -> tuple[Acl, Authenticator | None]:
        """Who may connect (None: no password checks) and what they may do: rules even where none are
        configured, since publishing on $SYS needs a rule that allows it (auth.ClientAcl). Raises
        UsersFileError (UsersFilePending: a users file without the content the config pins yet)."""
        acl = Acl(settings.acl, settings.acl_default, settings.user_acl)
        users = zone_users(settings)
        return acl, Authenticator(users) if users is not None else None

    @staticmethod
    def chain(name: str, settings: ZoneSettings) -> Chain:
        """The zone's authenticators; ConfigError names the one whose key or secret cannot be read."""
        out: list[ChainAuthenticator] = []
        for i, a in enumerate(settings.authentication):
            try:
                out.append(JwtAuthenticator(a) if isinstance(a, JwtAuthentication) else HttpAuthenticator(a))
            except (OSError, ValueError) as e:
                raise ConfigError(f"zones.{name}.authentication.{i} ({a.mechanism}): {e}") from e
        return Chain(out)

    def knows_certificate(self, common_name: str) -> bool:
        """Whether a verified certificate with this common name may be a user of the zone (see
        ZoneSettings.certificate_users)."""
        settings = self.settings
        if settings.certificate_users == "any" or common_name in settings.cert_users:
            return True
        return self.auth is not None and common_name in self.auth.users

    def update(self, settings: ZoneSettings) -> None:
        """Adopt changed settings (new sessions at once, live ones at their next delivery). Raises
        UsersFileError or ConfigError, changing nothing, if its users file or keys cannot be read."""
        acl, auth = self.access(settings)
        # (an unchanged chain is kept: its fetched key sets with it)
        same = settings.authentication == self.settings.authentication
        authn = self.authn if same else self.chain(self.name, settings)
        if authn is not self.authn:
            self.authn.close_soon()
        self.settings, self.acl, self.auth, self.authn = settings, acl, auth, authn
        self.limits.set_rate(settings.max_conn_rate)
