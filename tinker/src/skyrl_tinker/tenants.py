"""Tenants: who a request comes from, and how much each tenant may hold at once.

A tenant is named by the API key its requests carry (``X-API-Key``, the client's ``api_key``):

* ``--api-keys FILE``: many tenants, one ``<tenant> <key>`` per line (see :func:`load_api_keys`);
* ``--api-key KEY``: one shared key, every client is the tenant ``default``;
* neither: single-user mode, no authentication, every client is the tenant ``default``.

Every session, model, sampler, request and checkpoint belongs to the tenant that made it; the
service answers another tenant as if the id did not exist (404).
"""

from __future__ import annotations

import hmac
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TENANT = "default"  # single-user and --api-key modes; also the owner of runs written before tenants
KEY_PREFIX = "tml-"  # the tinker client refuses an api_key without it
MIN_KEY_LENGTH = 20  # in an --api-keys file: tml- and at least 16 more characters
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class TenantConfigError(ValueError):
    """A bad ``--api-keys`` file; the message names the file and line."""


@dataclass(frozen=True)
class Limits:
    """What one tenant may hold at once; beyond it a request gets a 429 naming the limit."""

    sessions: int = 64  # open sessions (one per ServiceClient), --max-sessions
    adapters: int = 64  # live training models (LoRA adapters), --max-adapters
    queued: int = 1024  # requests queued or running (training and sampling), --max-queued-requests
    # open sampling sessions, --max-sampling-sessions; past it the least recently used idle one is closed
    sampling_sessions: int = 64


def check_key(key: str, where: str) -> None:
    """Raise :class:`TenantConfigError` unless ``key`` is one a client can send and nobody can guess: it starts
    with ``tml-`` (the tinker client insists), has at least ``MIN_KEY_LENGTH`` characters and no spaces. The
    message says what is wrong, never the key. An empty key is the likely result of an unset variable
    (``--api-key "$KEY"``), so it is named as such rather than taken to mean "no key"."""
    if not key.strip():
        raise TenantConfigError(f"{where} is empty (was the variable that should hold it unset?); give a key, or "
                                "leave the option out for single-user mode")
    if not key.startswith(KEY_PREFIX) or len(key) < MIN_KEY_LENGTH or not key.isascii() or not key.isprintable() \
            or any(char.isspace() for char in key):
        raise TenantConfigError(f"{where} must start with {KEY_PREFIX!r} (the tinker client insists), have at least "
                                f"{MIN_KEY_LENGTH} characters and no spaces")


def load_api_keys(path: str | Path) -> dict[str, str]:
    """Read an ``--api-keys`` file: ``<tenant> <key>`` per line (blank lines and ``#`` comments skipped).

    A tenant name is letters, digits, ``.``, ``_`` or ``-`` (at most 64); a key passes :func:`check_key`; a
    tenant may have several keys, a key one tenant. The file must not be readable by group or others (as ssh
    insists for its keys). No error repeats a key. Returns key -> tenant.
    """
    try:
        text = _private_text(Path(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantConfigError(f"cannot read the --api-keys file {path}: {type(exc).__name__}") from None
    keys: dict[str, str] = {}
    line_of: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{path}, line {number}"
        if len(fields) != 2:
            raise TenantConfigError(f"{where}: expected '<tenant> <key>', got {len(fields)} fields")
        tenant, key = fields
        if tenant.startswith(KEY_PREFIX):
            raise TenantConfigError(f"{where}: the first field looks like a key: the columns are '<tenant> <key>', "
                                    "tenant first")
        if not _TENANT.fullmatch(tenant):
            raise TenantConfigError(f"{where}: the tenant name must be letters, digits, '.', '_' or '-' (at most 64, "
                                    "starting with a letter or digit)")
        check_key(key, f"{where}: the key of tenant {tenant!r}")
        if key in keys:
            raise TenantConfigError(f"{where}: the key of tenant {tenant!r} is already the key of tenant "
                                    f"{keys[key]!r} (line {line_of[key]}); a key names one tenant")
        keys[key], line_of[key] = tenant, number
    if not keys:
        raise TenantConfigError(f"the --api-keys file {path} has no keys (one '<tenant> <key>' per line)")
    return keys


def _private_text(path: Path) -> str:
    """The file's text, if only its owner may read it (the keys are everyone's passwords)."""
    with path.open(encoding="utf-8") as file:
        mode = os.fstat(file.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TenantConfigError(f"the --api-keys file {path} may be read or written by others (mode "
                                    f"{stat.S_IMODE(mode):o}); run chmod 600 {path}")
        return file.read()


def tenant_of(keys: Mapping[str, str] | None, given: str | None) -> str | None:
    """The tenant whose key is ``given`` (compared in constant time), ``DEFAULT_TENANT`` when the server
    has no keys, None for a missing or unknown key."""
    if keys is None:
        return DEFAULT_TENANT
    offered = (given or "").encode()
    found = None
    for key, tenant in keys.items():
        if hmac.compare_digest(key.encode(), offered):
            found = tenant
    return found
