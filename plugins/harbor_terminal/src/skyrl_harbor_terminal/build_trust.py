"""The host's extra trusted CAs in image builds, for machines whose egress passes a TLS-intercepting proxy.

A ``RUN pip install`` in a task's build trusts only the CAs of its base image, so behind a proxy
that re-signs TLS with its own CA it fails ("self-signed certificate in certificate chain"). When
builds have the network, :func:`resolve` finds the CAs this host trusts beyond the public ones
(``env.build_ca_bundle``: the system store's local additions, or a file the user names) and
:func:`rewrite` gives every stage that runs something a full bundle holding them, without changing
the Dockerfile on disk:

- the bundle lives in a tiny image of its own (:func:`ensure_image`, ``skyrl-build-trust:<hash>``),
  copied into each such stage with ``COPY --from``, so a ``COPY . /app`` of the task's context
  never picks it up;
- ``ARG`` defaults point the usual variables (``SSL_CERT_FILE``, ``PIP_CERT``, ``APT_CONFIG``, ...)
  at it: ``RUN`` steps see them, the image's configuration does not keep them, and a Dockerfile's
  own ``ENV`` of the same name still wins;
- the final stage ends by deleting the folder (as root, then back to the stage's user), so the
  agent's machine has neither the file nor the variables. The tag names the bundle's hash, so task
  images rebuild when the CAs change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.backends.docker.images import ImageBuildError

from .substitutes import image_uses, instruction_lines

if TYPE_CHECKING:
    from skyrl_sandbox.container_engine import ContainerEngine

BUNDLE_ENV = "SKYRL_BUILD_CA_BUNDLE"  # default of env.build_ca_bundle (unset: auto)
OFF = ("none", "off", "")
AUTO = "auto"
REPOSITORY = "skyrl-build-trust"
FOLDER = "/.skyrl-build-trust"  # in build stages only; deleted at the end of the final stage
BUNDLE = f"{FOLDER}/ca.pem"
VERSION = 1  # bump when what goes into the trust image changes
# Where distributions keep CAs an administrator added, and the bundle of all CAs the system trusts.
LOCAL_ADDITIONS = (Path("/usr/local/share/ca-certificates"), Path("/etc/pki/ca-trust/source/anchors"),
                   Path("/etc/ca-certificates/trust-source/anchors"), Path("/etc/pki/trust/anchors"))
SYSTEM_BUNDLES = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pki/tls/certs/ca-bundle.crt"),
                  Path("/etc/ssl/ca-bundle.pem"), Path("/etc/ssl/cert.pem"))
# What the tools of build steps read: OpenSSL/Python/Go/uv, requests, curl, pip, git, node/npm, cargo, conda, wget, apt.
VARIABLES = {name: BUNDLE for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT",
                                       "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS", "CARGO_HTTP_CAINFO",
                                       "CONDA_SSL_VERIFY")}
VARIABLES.update(WGETRC=f"{FOLDER}/wgetrc", APT_CONFIG=f"{FOLDER}/apt.conf")
_CONFIG_FILES = {"wgetrc": f"ca_certificate = {BUNDLE}\n", "apt.conf": f'Acquire::https::CAInfo "{BUNDLE}";\n'}
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.DOTALL)
_ROOT_USERS = ("", "root", "0", "root:root", "0:0")
TLS_SIGNS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "self-signed certificate in certificate chain",
             "self signed certificate in certificate chain", "unable to get local issuer certificate",
             "SSL certificate problem", "SELF_SIGNED_CERT_IN_CHAIN", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
             "certificate signed by unknown authority", "invalid peer certificate", "Certificate verification failed",
             "server certificate verification failed", "'s certificate, issued by", "curl: (60)")
_image_lock = threading.Lock()


@dataclass(frozen=True)
class TrustBundle:
    """A full CA bundle (the system's public CAs and the extra ones) and where the extra ones came from."""

    pem: str
    source: str  # e.g. "the system store's local additions (/usr/local/share/ca-certificates)"
    extra: int  # the extra certificates (some may be in the system bundle already)

    @property
    def tag(self) -> str:
        """The trust image holding this bundle."""
        digest = hashlib.sha256(f"{VERSION}\0{self.pem}".encode()).hexdigest()
        return f"{REPOSITORY}:{digest[:16]}"


def setting(value: str | None) -> str:
    """``env.build_ca_bundle`` as given, else ``$SKYRL_BUILD_CA_BUNDLE``, else ``auto``."""
    if value is not None:
        return value.strip()
    return os.environ.get(BUNDLE_ENV, "").strip() or AUTO


def resolve(value: str | None) -> TrustBundle | None:
    """The bundle build steps trust for ``env.build_ca_bundle``; None when it is off or the host adds no CA.

    ``auto``: the system bundle with the system store's local additions, else with ``$SSL_CERT_FILE``
    when that names another file; a path: the system bundle with that file's CAs (a file that is not
    PEM or DER CA certificates is an :class:`ImageBuildError` naming the option).
    """
    chosen = setting(value)
    if chosen.lower() in OFF:
        return None
    system = next((path for path in SYSTEM_BUNDLES if path.is_file()), None)
    base = _certificates(system.read_bytes()) if system else []
    if chosen.lower() != AUTO:
        path = Path(chosen).expanduser()
        where = f"env.build_ca_bundle={chosen} (or ${BUNDLE_ENV})"
        if not path.is_file():
            raise ImageBuildError(f"{where}: no such file; name a PEM file of CA certificates, 'auto' for the "
                                  "system store's local additions, or 'none'")
        extra = _certificates(path.read_bytes())
        if not extra:
            raise ImageBuildError(f"{where}: holds no CA certificate (expected PEM: -----BEGIN CERTIFICATE-----)")
        return _bundle(base, extra, str(path))
    added = sorted(file for folder in LOCAL_ADDITIONS if folder.is_dir() for file in folder.rglob("*")
                   if file.suffix in (".crt", ".pem", ".cer") and file.is_file())
    if added:
        folders = ", ".join(str(folder) for folder in LOCAL_ADDITIONS if any(folder in file.parents for file in added))
        extra = [cert for file in added for cert in _certificates(file.read_bytes())]
        return _bundle(base, extra, f"the system store's local additions ({folders})")
    named = os.environ.get("SSL_CERT_FILE", "")
    if named and Path(named).is_file() and (system is None or Path(named).resolve() != system.resolve()):
        return _bundle(base, _certificates(Path(named).read_bytes()), f"$SSL_CERT_FILE ({named})")
    return None


def ensure_image(engine: ContainerEngine, bundle: TrustBundle, progress: images.Progress | None = None) -> str:
    """The trust image of ``bundle`` on ``engine`` (``FROM scratch``: the bundle and the wget/apt settings naming
    it), built once."""
    with _image_lock:
        if images.image_exists(engine, bundle.tag):
            return bundle.tag
        with tempfile.TemporaryDirectory(prefix="skyrl-build-trust-") as folder:
            context = Path(folder)
            files = {"ca.pem": bundle.pem, **_CONFIG_FILES}
            for name, text in files.items():
                (context / name).write_text(text, encoding="utf-8")
            (context / "Dockerfile").write_text(f"FROM scratch\nCOPY {' '.join(files)} {FOLDER[1:]}/\n")
            return images.build_image(engine, context, bundle.tag, progress=progress)


def rewrite(text: str, image: str, user_of: Callable[[str], str]) -> str | None:
    """``text`` (a Dockerfile) with the trust of ``image`` in each stage that runs something, and without it at the
    end; None when no stage runs anything. ``user_of(image)`` is an image's configured user."""
    stages = _stages(text)
    carries: list[bool] = []
    for index, stage in enumerate(stages):
        parent = _parent(stages, index)
        carries.append(stage.runs or (parent is not None and carries[parent]))
    if not any(stage.runs for stage in stages):
        return None
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    trust = [f"COPY --from={image} {FOLDER}/ {FOLDER}/\n", *(f"ARG {key}={value}\n" for key, value in VARIABLES.items())]
    for stage in reversed(stages):  # from the end, so earlier line numbers stay valid
        if stage.runs:
            lines[stage.from_end:stage.from_end] = trust
    if carries[-1]:
        user = _final_user(stages, len(stages) - 1, user_of)
        remove = f"RUN {json.dumps(['rm', '-rf', FOLDER])}\n"
        lines += [remove] if user.strip() in _ROOT_USERS else ["USER root\n", remove, f"USER {user}\n"]
    return "".join(lines)


def tls_failure_hint(output: str, bundle: TrustBundle | None, value: str | None) -> str | None:
    """What to do when a build's output shows a TLS certificate failure; None when it shows none."""
    sign = next((sign for sign in TLS_SIGNS if sign in output), None)
    if sign is None:
        return None
    said = f"a RUN step could not verify a TLS certificate ('{sign}')"
    if bundle is None:
        state = ("it is off" if setting(value).lower() in OFF else
                 "it is auto and this host adds none: nothing in " + ", ".join(map(str, LOCAL_ADDITIONS[:1]))
                 + " and no $SSL_CERT_FILE")
        return (f"{said}. Behind a TLS-intercepting proxy, build steps must trust its CA: name it with "
                f"env.build_ca_bundle=/path/to/ca.pem (or {BUNDLE_ENV}=/path/to/ca.pem); {state}. The agent's "
                "machine never gets it")
    return (f"{said}, although build steps trusted {bundle.extra} extra CA(s) from {bundle.source}: name the CA "
            f"that signs your proxy's certificates with env.build_ca_bundle=/path/to/ca.pem (or {BUNDLE_ENV}), and "
            f"check that the Dockerfile sets no {', '.join(list(VARIABLES)[:4])} of its own (its ENV wins)")


def image_user(engine: ContainerEngine, ref: str) -> str:
    """The user an image on ``engine`` runs as ("" for root or an image the engine does not have)."""
    import docker

    try:
        return engine.shared_client().api.inspect_image(ref)["Config"].get("User") or ""
    except docker.errors.APIError:
        return ""


# -- reading --------------------------------------------------------------------------------------------------


def _certificates(data: bytes) -> list[bytes]:
    """The DER certificates of a PEM file (or of one DER certificate); invalid ones are dropped."""
    text = data.decode("ascii", errors="replace")
    blocks = _PEM.findall(text) if "-----BEGIN" in text else [ssl.DER_cert_to_PEM_cert(data)] if data else []
    found: list[bytes] = []
    for block in blocks:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=block)
        except (ssl.SSLError, ValueError):
            continue
        found.append(ssl.PEM_cert_to_DER_cert(block))
    return found


def _bundle(base: list[bytes], extra: Iterable[bytes], source: str) -> TrustBundle | None:
    """The system's certificates and then the extra ones it lacks; None without extra ones."""
    wanted = list(dict.fromkeys(extra))
    if not wanted:
        return None
    known = set(base)
    pem = "".join(ssl.DER_cert_to_PEM_cert(cert) for cert in [*base, *(cert for cert in wanted if cert not in known)])
    return TrustBundle(pem=pem, source=source, extra=len(wanted))


@dataclass
class _Stage:
    from_line: int  # 1-based
    from_end: int  # index of the line after the FROM instruction (continuations included)
    image: str  # as the FROM names it, global ARGs filled in
    name: str
    runs: bool = False
    user: str | None = None  # the last USER as written


def _stages(text: str) -> list[_Stage]:
    physical = text.splitlines()
    refs = {use.line: use.ref for use in image_uses(text) if use.instruction == "FROM"}
    stages: list[_Stage] = []
    for number, line in instruction_lines(text):
        words = line.split()
        keyword = words[0].upper()
        if keyword == "FROM":
            end = number
            while end < len(physical) and physical[end - 1].rstrip().endswith("\\"):
                end += 1
            whole = " ".join(part.rstrip().removesuffix("\\") for part in physical[number - 1:end])
            rest = [word for word in whole.split()[1:] if not word.startswith("--")]
            name = rest[2] if len(rest) >= 3 and rest[1].upper() == "AS" else ""
            stages.append(_Stage(number, end, refs.get(number, rest[0] if rest else ""), name.lower()))
        elif stages and keyword == "RUN":
            stages[-1].runs = True
        elif stages and keyword == "USER":
            stages[-1].user = line.strip()[len("USER"):].strip()
    return stages


def _parent(stages: list[_Stage], index: int) -> int | None:
    """The index of the earlier stage that stage ``index`` starts FROM, or None for an image."""
    image = stages[index].image.lower()
    return next((i for i in reversed(range(index)) if stages[i].name and stages[i].name == image), None)


def _final_user(stages: list[_Stage], index: int, user_of: Callable[[str], str]) -> str:
    stage = stages[index]
    if stage.user is not None:
        return stage.user
    parent = _parent(stages, index)
    return user_of(stage.image) if parent is None else _final_user(stages, parent, user_of)
