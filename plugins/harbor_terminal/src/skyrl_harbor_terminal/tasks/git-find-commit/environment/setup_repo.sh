#!/bin/bash
# Builds /app/project at image build time with fixed identities and dates (deterministic hashes).
set -euo pipefail
export GIT_AUTHOR_NAME="Mira Lind" GIT_AUTHOR_EMAIL="mira@example.com"
export GIT_COMMITTER_NAME="Mira Lind" GIT_COMMITTER_EMAIL="mira@example.com"
mkdir -p /app/project
cd /app/project
git init -q .
git symbolic-ref HEAD refs/heads/main
git config user.name "Dev"
git config user.email "dev@example.com"
day=0
commit() {
    day=$((day + 1))
    local when
    when=$(printf '2023-09-%02dT09:15:00+00:00' "$day")
    GIT_AUTHOR_DATE="$when" GIT_COMMITTER_DATE="$when" git commit -q -m "$1"
}

printf '# fetcher\n\nDownloads price lists from suppliers.\n' > README.md
git add README.md; commit "Initial commit"

printf 'DEBUG = False\nBASE_URL = "https://prices.example.com"\n' > settings.py
git add settings.py; commit "Add settings module"

printf 'import urllib.request\n\nimport settings\n\n\ndef fetch(path):\n    return urllib.request.urlopen(settings.BASE_URL + path).read()\n' > client.py
git add client.py; commit "Add HTTP client"

printf 'DEBUG = False\nBASE_URL = "https://prices.example.com"\nRETRIES = 3\n' > settings.py
git add settings.py; commit "Retry failed downloads"

printf 'DEBUG = False\nBASE_URL = "https://prices.example.com"\nRETRIES = 3\nTIMEOUT_SECONDS = 30\n' > settings.py
git add settings.py; commit "Tune network settings"

printf 'import urllib.request\n\nimport settings\n\n\ndef fetch(path):\n    url = settings.BASE_URL + path\n    return urllib.request.urlopen(url, timeout=settings.TIMEOUT_SECONDS).read()\n' > client.py
git add client.py; commit "Use the configured timeout in the client"

printf '# fetcher\n\nDownloads price lists from suppliers.\n\nSettings live in settings.py.\n' > README.md
git add README.md; commit "Document settings"

printf 'DEBUG = False\nBASE_URL = "https://prices.example.com"\nRETRIES = 5\nTIMEOUT_SECONDS = 60\n' > settings.py
git add settings.py; commit "Be more patient with slow suppliers"

printf 'DEBUG = True\nBASE_URL = "https://prices.example.com"\nRETRIES = 5\nTIMEOUT_SECONDS = 60\n' > settings.py
git add settings.py; commit "Enable debug output"

git log --format='%H %s'
