#!/bin/bash
# Builds /app/repo at image build time with fixed identities and dates (deterministic hashes).
set -euo pipefail
export GIT_AUTHOR_NAME="Repo Owner" GIT_AUTHOR_EMAIL="owner@example.com"
export GIT_COMMITTER_NAME="Repo Owner" GIT_COMMITTER_EMAIL="owner@example.com"
mkdir -p /app/repo
cd /app/repo
git init -q .
git symbolic-ref HEAD refs/heads/main
git config user.name "Dev"
git config user.email "dev@example.com"

printf '# Greeter\n\nA tiny command line greeter.\n' > README.md
git add README.md
GIT_AUTHOR_DATE="2024-02-01T10:00:00+00:00" GIT_COMMITTER_DATE="2024-02-01T10:00:00+00:00" \
    git commit -q -m "Initial commit"

printf 'import sys\n\n\ndef main():\n    print("Hello")\n\n\nif __name__ == "__main__":\n    main()\n' > app.py
git add app.py
GIT_AUTHOR_DATE="2024-02-02T11:30:00+00:00" GIT_COMMITTER_DATE="2024-02-02T11:30:00+00:00" \
    git commit -q -m "Add app entry point"

# Staged, not committed: a new module and a change to app.py.
printf 'def greet(name):\n    return f"Hello, {name}!"\n' > greeting.py
printf 'import sys\n\nfrom greeting import greet\n\n\ndef main():\n    print(greet(sys.argv[1] if len(sys.argv) > 1 else "world"))\n\n\nif __name__ == "__main__":\n    main()\n' > app.py
git add greeting.py app.py

# Not staged: must stay out of the commit.
printf 'remember to write tests\n' > notes.txt
printf '\nUsage: python3 app.py NAME\n' >> README.md

git rev-parse HEAD
git write-tree
