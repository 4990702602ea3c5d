"""Builds behind a TLS-intercepting proxy: the host's extra CAs reach RUN steps, never the agent's machine.

Without Docker: the Dockerfile rewrite (stages that run something get the trust right after their
FROM, the final stage ends without it, as root and back to its user), where the CAs come from
(``env.build_ca_bundle``: auto, a file, none) and the hint a TLS failure gets. On docker, with the
build network: ``pip install`` from PyPI in a task's build, a multi-stage build ending as a non-root
user, and a compose service's image all build, and neither the agent's machine nor the images keep
the bundle or its variables. Where this host's egress needs its extra CAs (a proxy re-signs TLS),
the same build with ``build_ca_bundle = "none"`` fails naming the option.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from harbor_helpers import bash, play, write_task
from skyrl_harbor_terminal import build_trust
from skyrl_harbor_terminal.build_trust import BUNDLE_ENV, FOLDER, VARIABLES, TrustBundle
from skyrl_harbor_terminal.builds import build_task_image, task_image_tag
from skyrl_harbor_terminal.config import HarborTerminalConfig
from skyrl_harbor_terminal.services import service_image_tag
from skyrl_harbor_terminal.task import load_task
from skyrl_sandbox.backends.docker.images import ImageBuildError

TRUST = [f"COPY --from=trust:1 {FOLDER}/ {FOLDER}/\n", *(f"ARG {key}={value}\n" for key, value in VARIABLES.items())]
REMOVE = f'RUN ["rm", "-rf", "{FOLDER}"]\n'
PEM = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n?", re.DOTALL)
PIP_SIX = "FROM python:3.11-slim-bookworm\nRUN pip install --no-cache-dir six\nWORKDIR /app\n"
PIP_TASK = {"environment/Dockerfile": PIP_SIX,
            "tests/test.sh": "python3 -c 'import six' && echo 1 > /logs/verifier/reward.txt\n"}
SHOW = f"ls -A /; env; python3 -c 'import six; print(\"six\", six.__version__)'; test -e {FOLDER} && echo LEAKED"


def rewritten(text: str, user: str = "") -> str | None:
    return build_trust.rewrite(text, "trust:1", lambda image: user)


# -- the Dockerfile rewrite ------------------------------------------------------------------------------------


def test_a_stage_that_runs_something_gets_the_trust_after_its_from_and_the_final_stage_ends_without_it() -> None:
    text = "# a comment\nFROM base:1\nARG PIP_CERT=/mine.pem\nENV SSL_CERT_FILE=/mine.pem\nRUN pip install six\n"
    lines = (rewritten(text) or "").splitlines(keepends=True)
    assert lines[:2] == ["# a comment\n", "FROM base:1\n"]
    assert lines[2:2 + len(TRUST)] == TRUST  # before the file's own ARG and ENV, which therefore win
    assert lines[2 + len(TRUST):] == ["ARG PIP_CERT=/mine.pem\n", "ENV SSL_CERT_FILE=/mine.pem\n",
                                      "RUN pip install six\n", REMOVE]  # root: no USER switch


def test_nothing_changes_when_no_stage_runs_anything() -> None:
    assert rewritten("FROM base:1\nCOPY . /app\nWORKDIR /app\n") is None


def test_multi_stage_builds_trust_only_stages_that_run_and_end_as_the_final_users() -> None:
    text = ("ARG BASE=base:1\n"
            "FROM --platform=linux/amd64 ${BASE} \\\n    AS build\n"
            "RUN make\n"
            "USER builder\n"
            "FROM scratch AS files\n"
            "COPY a /a\n"
            "FROM build AS final\n"
            "COPY --from=files /a /a\n"
            "USER ${APP_USER:-app}")  # no newline at the end
    assert rewritten(text, user="nobody") == (
        "ARG BASE=base:1\n"
        "FROM --platform=linux/amd64 ${BASE} \\\n    AS build\n" + "".join(TRUST) + "RUN make\nUSER builder\n"
        "FROM scratch AS files\nCOPY a /a\n"
        "FROM build AS final\nCOPY --from=files /a /a\nUSER ${APP_USER:-app}\n"
        f"USER root\n{REMOVE}USER ${{APP_USER:-app}}\n")  # inherited from build: removed, the user as written


@pytest.mark.parametrize(("final", "user", "end"), [
    ("FROM build\n", "", REMOVE),  # the stage's user comes from the stage it starts from (root here)
    ("FROM other:1\nRUN true\n", "nobody", f"USER root\n{REMOVE}USER nobody\n"),  # the image's configured user
    ("FROM other:1\nCOPY x /x\n", "nobody", ""),  # runs nothing and inherits nothing: left as it is
])
def test_the_final_stage_removes_the_trust_as_root_and_returns_to_its_user(final: str, user: str, end: str) -> None:
    head = "FROM base:1 AS build\nRUN true\n"
    text = rewritten(head + final, user=user) or ""
    assert text.endswith(final.replace("RUN true\n", "".join(TRUST) + "RUN true\n") + end)


# -- where the CAs come from ---------------------------------------------------------------------------------


@pytest.fixture
def host_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[str]]:
    """A system bundle of two public CAs and an empty local-additions folder (certificates from this host's store)."""
    system = next(path for path in build_trust.SYSTEM_BUNDLES if path.is_file())
    certs = PEM.findall(system.read_text())[:3]
    bundle = tmp_path / "ca-certificates.crt"
    bundle.write_text("".join(certs[:2]))
    local = tmp_path / "local"
    local.mkdir()
    monkeypatch.setattr(build_trust, "SYSTEM_BUNDLES", (bundle,))
    monkeypatch.setattr(build_trust, "LOCAL_ADDITIONS", (local,))
    monkeypatch.delenv(BUNDLE_ENV, raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    return bundle, local, certs


def count(bundle: TrustBundle | None) -> int:
    assert bundle is not None
    return bundle.pem.count("BEGIN CERTIFICATE")


def test_auto_adds_the_system_stores_local_additions_to_the_system_bundle(host_store: Any) -> None:
    _, local, certs = host_store
    assert build_trust.resolve(None) is None  # nothing added here: builds stay as they are
    (local / "proxy").mkdir()
    (local / "proxy" / "egress.crt").write_text(certs[2])
    (local / "README").write_text("not a certificate\n")
    bundle = build_trust.resolve(None)
    assert bundle is not None and count(bundle) == 3 and bundle.extra == 1 and str(local) in bundle.source
    (local / "again.crt").write_text(certs[2] + certs[0])  # one already known: no duplicate
    again = build_trust.resolve("auto")
    assert again is not None and count(again) == 3 and again.tag == bundle.tag  # the same CAs: the same image
    assert build_trust.resolve("none") is None and build_trust.resolve("") is None


def test_auto_falls_back_to_ssl_cert_file_and_the_environment_variable_names_a_file(
        host_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle, _, certs = host_store
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert build_trust.resolve(None) is None  # the system bundle itself adds nothing
    mine = tmp_path / "mine.pem"
    mine.write_text(certs[2])
    monkeypatch.setenv("SSL_CERT_FILE", str(mine))
    assert count(build_trust.resolve(None)) == 3
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv(BUNDLE_ENV, str(mine))
    named = build_trust.resolve(None)
    assert named is not None and named.source == str(mine) and count(named) == 3
    assert build_trust.resolve("none") is None  # env.build_ca_bundle beats the variable


def test_a_named_file_that_is_missing_or_holds_no_certificate_is_refused_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match=r"env.build_ca_bundle=/no/such.pem \(or \$SKYRL_BUILD_CA_BUNDLE\): "
                                              r"no such file"):
        build_trust.resolve("/no/such.pem")
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    with pytest.raises(ImageBuildError, match=r"junk.pem.*holds no CA certificate"):
        build_trust.resolve(str(junk))


@pytest.mark.parametrize("output", [
    "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
    "self-signed certificate in certificate chain (_ssl.c:992)'))",
    "curl: (60) SSL certificate problem: self-signed certificate in certificate chain",
    "ERROR: cannot verify pypi.org's certificate, issued by 'CN=proxy':",
    "npm ERR! code SELF_SIGNED_CERT_IN_CHAIN",
    "error: invalid peer certificate: UnknownIssuer",
])
def test_tls_failures_name_the_option(output: str) -> None:
    off = build_trust.tls_failure_hint(output, None, "none")
    assert off is not None and "env.build_ca_bundle=/path/to/ca.pem" in off and "it is off" in off
    auto = build_trust.tls_failure_hint(output, None, "auto")
    assert auto is not None and "it is auto and this host adds none" in auto
    used = build_trust.tls_failure_hint(output, TrustBundle("", "the store", 2), None)
    assert used is not None and "trusted 2 extra CA(s) from the store" in used and "env.build_ca_bundle" in used
    assert build_trust.tls_failure_hint("E: Unable to locate package cowsay", None, None) is None


# -- on docker ----------------------------------------------------------------------------------------------


def egress_needs_extra_cas() -> str | None:
    """None when pypi.org verifies only with this host's extra CAs (a proxy re-signs TLS); else why not."""
    bundle = build_trust.resolve("auto")
    if bundle is None:
        return "this host trusts no extra CA (nothing in the system store's local additions)"
    added = "".join(path.read_text(errors="replace") for folder in build_trust.LOCAL_ADDITIONS if folder.is_dir()
                    for path in folder.rglob("*.crt"))
    extra = {ssl.PEM_cert_to_DER_cert(pem) for pem in PEM.findall(added)}
    public = [pem for pem in PEM.findall(bundle.pem) if ssl.PEM_cert_to_DER_cert(pem) not in extra]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata="".join(public))
    try:
        with socket.create_connection(("pypi.org", 443), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="pypi.org"):
            return "pypi.org verifies with the public CAs alone here (no TLS-intercepting proxy)"
    except ssl.SSLCertVerificationError:
        return None
    except OSError as exc:
        return f"pypi.org cannot be reached from here ({exc})"


def clean(tag: str, script: str = "true") -> str:
    """What ``script`` prints in a container of ``tag``, after checking the image keeps no trust."""
    from skyrl_sandbox.backends.docker.client import DOCKER

    client = DOCKER.shared_client()
    config = client.api.inspect_image(tag)["Config"]
    assert not {entry.split("=", 1)[0] for entry in config.get("Env") or []} & set(VARIABLES), config["Env"]
    output = client.containers.run(tag, ["sh", "-c", f"test ! -e {FOLDER} && env && {script}"], network_mode="none",
                                   remove=True, user="root").decode()
    assert not any(f"{name}=" in output for name in VARIABLES), output
    return output


@pytest.mark.docker
@pytest.mark.slow
def test_pip_install_in_a_build_trusts_the_hosts_cas_and_the_agents_machine_keeps_none(docker_backend: str,
                                                                                        tmp_path: Path) -> None:
    row = write_task(tmp_path / "pip-six", PIP_TASK, base_only=False)
    results, _ = play(row, [bash(SHOW, done=True)], backend="docker", build_network=True, build_logs=str(tmp_path))
    assert "error" not in results[-1].info, results[-1].info
    seen = results[-1].observation[-1]["content"].split("\n", 1)[1]  # what the command printed, not the command
    assert results[-1].reward == 1.0 and "six 1." in seen and "LEAKED" not in seen
    assert FOLDER.lstrip("/") not in seen and not any(f"{name}=" in seen for name in VARIABLES), seen
    clean(task_image_tag(load_task(row["task_path"], quiet=True)))
    assert (Path(row["task_path"]) / "environment" / "Dockerfile").read_text() == PIP_SIX


@pytest.mark.docker
@pytest.mark.slow
def test_without_the_hosts_cas_the_build_fails_on_tls_naming_the_option(docker_backend: str, tmp_path: Path) -> None:
    why_not = egress_needs_extra_cas()
    if why_not is not None:
        pytest.skip(f"no TLS failure to see: {why_not}")
    row = write_task(tmp_path / "pip-six-untrusted", PIP_TASK, base_only=False)
    results, _ = play(row, [bash("true", done=True)], backend="docker", build_network=True,
                      build_ca_bundle="none", build_logs=str(tmp_path))
    error = results[-1].info["error"]
    assert "its image did not build" in error and "could not verify a TLS certificate" in error
    assert "env.build_ca_bundle=/path/to/ca.pem (or SKYRL_BUILD_CA_BUNDLE=/path/to/ca.pem); it is off" in error
    log = Path(error.rsplit("build log: ", 1)[1].strip())
    assert "hint: a RUN step could not verify a TLS certificate" in log.read_text()


@pytest.mark.docker
@pytest.mark.slow
def test_a_multi_stage_build_ending_as_a_non_root_user_trusts_every_running_stage_and_ends_clean(
        docker_backend: str, tmp_path: Path) -> None:
    context = tmp_path / "multi"
    context.mkdir()
    (context / "notes.txt").write_text("notes\n")
    (context / "Dockerfile").write_text(
        "ARG PY=python:3.11-slim-bookworm\n"
        "FROM ${PY} AS wheels\n"
        "ENV CURL_CA_BUNDLE=/its/own.pem\n"
        'RUN test "$CURL_CA_BUNDLE" = /its/own.pem && pip download --no-cache-dir --no-deps --dest /wheels six\n'
        "FROM scratch AS notes\n"
        "COPY notes.txt /notes.txt\n"
        "FROM ${PY}\n"
        "COPY --from=wheels /wheels /wheels\n"
        "COPY --from=notes /notes.txt /notes.txt\n"
        "COPY . /ctx\n"
        "RUN pip install --no-cache-dir /wheels/*.whl && useradd --create-home runner\n"
        "USER runner\n"
        "RUN python3 -c \"import urllib.request as u; u.urlopen('https://pypi.org/simple/idna/', timeout=60)\"\n")
    tag = "skyrl-harbor/test-build-trust-multi:1"
    config = HarborTerminalConfig(build_network=True, build_logs=str(tmp_path))
    from skyrl_sandbox.backends.docker.client import DOCKER

    asyncio.run(build_task_image(DOCKER, "the multi-stage test image", context, "Dockerfile", tag, config,
                                 timeout_s=300))

    try:
        assert DOCKER.shared_client().api.inspect_image(tag)["Config"]["User"] == "runner"
        output = clean(tag, "ls -A /ctx; cat /notes.txt; python3 -c 'import six; print(six.__name__)'")
        assert output.endswith("Dockerfile\nnotes.txt\nnotes\nsix\n"), output  # COPY . took nothing of ours
        log = (tmp_path / "skyrl-harbor_test-build-trust-multi_1.log").read_text()
        assert "RUN steps trust " in log.splitlines()[1] and "(env.build_ca_bundle)" in log
    finally:
        DOCKER.shared_client().api.remove_image(tag, force=True)


@pytest.mark.docker
@pytest.mark.slow
def test_a_compose_service_image_build_trusts_the_hosts_cas_too(docker_backend: str, tmp_path: Path) -> None:
    compose = ("services:\n  api:\n    build: ./api\n"
               "    command: [python3, -c, 'import six, time; time.sleep(600)']\n")
    row = write_task(tmp_path / "compose-pip", {
        "environment/docker-compose.yaml": compose, "environment/api/Dockerfile": PIP_SIX,
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"}, base_only=False)
    results, _ = play(row, [bash("true", done=True)], backend="docker", build_network=True, build_logs=str(tmp_path))
    assert "error" not in results[-1].info, results[-1].info
    assert results[-1].reward == 1.0
    service = service_image_tag(load_task(row["task_path"], quiet=True), "api")
    assert "six\n" in clean(service, "python3 -c 'import six; print(six.__name__)'")
