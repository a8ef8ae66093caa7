"""Who asks and what they may do: the dashboard's three roles, the actor of a request, the role map.

- `viewer` reads every page; `operator` also acts on jobs, workers and queues (retry, cancel, delete,
  run now, bulk edits, pause, resume, drain, stop, restart); `admin` also changes what the fleet is
  configured to do (queue limits, periodic jobs, keys). Each role can do everything of the ones below it.
- Every route of the dashboard declares the role it needs (`requires`); a route that declares none is
  a defect the tests find.
- `actor_of(request)` names who made a request the dashboard let in, and in which role: the trusted
  proxy's user, the token's role (``admin-token``), the host application's user, or ``anonymous`` on an
  open dashboard. Later records (an audit trail) take their actor from it.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from starlette.requests import HTTPConnection
from starlette.types import Scope

__all__ = [
    "PUBLIC",
    "Actor",
    "Role",
    "TrustedProxy",
    "actor_of",
    "load_role_map",
    "required_role",
    "requires",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
E = TypeVar("E")

#: The scope key of the actor the dashboard let in (`actor_of` reads it).
ACTOR_KEY: Final = "jobbus.dashboard.actor"
#: The scope key where a host application's mount (`jobbus.contrib.fastapi`, `jobbus.contrib.django`)
#: puts the `Actor` it authenticated; read only by a dashboard made with ``host_auth=True``.
HOST_ACTOR_KEY: Final = "jobbus.dashboard.host_actor"
#: In a role map, the role of every user not named in it.
ANY_USER: Final = "*"


class Role(enum.Enum):
    """A dashboard role; each can do everything of the ones below it."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def allows(self, needed: Role) -> bool:
        """Whether this role may use a route that needs `needed`."""
        return self.rank >= needed.rank

    @classmethod
    def parse(cls, value: Role | str, *, what: str = "role") -> Role:
        """`value` as a role, or ValueError naming `what` and the three roles."""
        if isinstance(value, Role):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        raise ValueError(f"{what}: {value!r} is not a role (viewer, operator or admin)")


_RANKS = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}
#: What a route that anyone may reach declares (the login form, the health check, static files).
PUBLIC: Final = "public"


@dataclass(frozen=True, slots=True)
class Actor:
    """Who made a request, and the role the dashboard gave it."""

    name: str
    role: Role

    def capped(self, role: Role) -> Actor:
        """This actor with at most `role` (a read-only dashboard caps everyone at viewer)."""
        return self if role.allows(self.role) else Actor(self.name, role)


def actor_of(request: HTTPConnection | Scope) -> Actor | None:
    """The actor of a request the dashboard has let in (None for one it has not, or outside it)."""
    scope = request.scope if isinstance(request, HTTPConnection) else request
    actor = scope.get(ACTOR_KEY)
    return actor if isinstance(actor, Actor) else None


def requires(role: Role | str, endpoint: E) -> E:
    """`endpoint`, declaring the role a request needs to reach it (`PUBLIC` for anyone)."""
    endpoint.__dict__["jobbus_role"] = role if role == PUBLIC else Role.parse(role)
    return endpoint


def required_role(endpoint: Any) -> Role | str:
    """The role `endpoint` declared with `requires`; LookupError when it declared none."""
    role = getattr(endpoint, "jobbus_role", None)
    if role is None:
        raise LookupError(f"{endpoint!r} declares no role")
    return role  # type: ignore[no-any-return]


# -- behind a proxy ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrustedProxy:
    """Users named by a proxy: `header` carries the user's name, believed only from `networks`, and
    `roles` maps names to roles (``*`` for everyone else; a user it does not name is refused)."""

    header: str
    networks: tuple[Network, ...]
    roles: Mapping[str, Role]

    @classmethod
    def of(
        cls, header: str, networks: Iterable[str], roles: Mapping[str, Role | str] | str | os.PathLike[str]
    ) -> TrustedProxy:
        """Checked settings; ValueError naming the bad header, network, file or role."""
        name = header.strip().lower() if isinstance(header, str) else ""
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise ValueError(f"trusted user header {header!r} is not a header name")
        if isinstance(networks, str | bytes):
            raise TypeError("trusted proxies are a list of networks, not one string")
        parsed = tuple(proxy_network(entry) for entry in networks)
        if not parsed:
            raise ValueError("a trusted user header needs at least one trusted proxy network (CIDR)")
        table = load_role_map(roles) if isinstance(roles, str | os.PathLike) else checked_roles(roles)
        return cls(name, parsed, table)

    def trusts(self, scope: Scope) -> bool:
        """Whether the request's peer (the TCP connection's address) is one of the trusted proxies."""
        client = scope.get("client")
        if not client:
            return False
        try:
            address = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)

    def role_of(self, user: str) -> Role | None:
        return self.roles.get(user, self.roles.get(ANY_USER))


def proxy_network(entry: str) -> Network:
    """A trusted proxy's network (``10.0.0.0/8``, ``127.0.0.1``, ``::1``); ValueError naming the entry."""
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except (ValueError, AttributeError):
        raise ValueError(f"trusted proxy {entry!r} is not an IP address or network (CIDR, e.g. 10.0.0.0/8)") from None


def checked_roles(roles: Mapping[str, Role | str], *, where: str = "role map") -> dict[str, Role]:
    if not isinstance(roles, Mapping):
        raise TypeError(f"{where} must map user names to roles")
    table = {}
    for user, role in roles.items():
        if not isinstance(user, str) or not user.strip():
            raise ValueError(f"{where}: {user!r} is not a user name")
        table[user.strip()] = Role.parse(role, what=f"{where}, user {user!r}")
    return table


def load_role_map(path: str | os.PathLike[str]) -> dict[str, Role]:
    """The `[roles]` table of the TOML file at `path` (``alice = "admin"``, ``"*" = "viewer"``);
    ValueError naming the file and what is wrong with it."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"role map {file}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"role map {file} is not valid TOML: {exc}") from None
    roles = data.get("roles")
    if not isinstance(roles, dict):
        raise ValueError(f'role map {file} has no [roles] table (e.g. [roles] then alice = "admin")')
    unknown = sorted(set(data) - {"roles"})
    if unknown:
        raise ValueError(f"role map {file}: unknown table or key {', '.join(unknown)} (only [roles])")
    return checked_roles(roles, where=f"role map {file}")
