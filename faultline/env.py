"""Typed readers for environment settings that fail loudly on bad values.

Settings read the environment only through these helpers so that a typo such as
`FAULTLINE_DEBUG=ture` stops the process with a message instead of silently meaning False.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


class ConfigError(RuntimeError):
    """A setting from the environment has a value we cannot use."""


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ConfigError(
        f"{name}={raw!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off"
    )


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={value} is below the minimum {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated CIDRs (`10.0.0.0/8,::1/128`); a bare address is one host."""
    out = []
    for item in env_list(name, []):
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(
                f"{name}: {item!r} is not a network; write CIDRs like 10.0.0.0/8 or ::1/128"
            ) from None
    return out


def env_secret(name: str, default: str = "") -> str:
    """Read a secret from NAME, or from the file named by NAME_FILE (Docker/K8s secrets)."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={path!r} cannot be read: {exc.strerror}") from None
    return os.environ.get(name, default)


def database_from_url(url: str) -> dict[str, object]:
    """Turn postgres://user:pass@host:port/name?host=/socket into Django's DATABASES entry.

    Several hosts, as libpq takes them (postgres://u@db1:5432,db2:5432/name?
    target_session_attrs=read-write: a primary and its standby), become libpq's host and
    port lists; the query's options (target_session_attrs, connect_timeout...) go to libpq
    as they are, so a connection finds whichever host is the primary now.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ConfigError(f"DATABASE_URL must be a postgres:// URL, got scheme {parts.scheme!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts, ports = [], []
    for item in hostlist.split(","):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if port and not port.isdigit():
            raise ConfigError(f"DATABASE_URL: port {port!r} of host {host!r} is not a number")
        hosts.append(unquote(host))
        ports.append(port)
    if any(ports) and len(ports) > 1:
        ports = [p or "5432" for p in ports]  # libpq wants one port, or one per host
    socket_dir = query.pop("host", None)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "faultline",
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": socket_dir or ",".join(hosts),
        "PORT": ",".join(ports) if any(ports) else "",
        "OPTIONS": query,
    }
