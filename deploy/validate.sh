#!/usr/bin/env bash
# Validates the Kubernetes manifests offline: bash deploy/validate.sh [file.yaml|folder ...]
# (default: every deploy/*.yaml). Built-in kinds against the Kubernetes JSON
# schemas bundled in the kubernetes-validate package (strict: unknown fields
# are errors); ServiceMonitor and ScaledObject against the upstream CRDs in
# deploy/schemas/; then the cross-checks in validate.py. See README.md.
#
# The first run installs the pinned requirements.txt into a venv (needs PyPI,
# ~20 s); later runs need no network. Exits 1 on an invalid manifest, with one
# `ERROR <file>:<line>: <Kind>/<name>: <field>: <message>` line per problem.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/hourglass-deploy-venv"
req="$here/requirements.txt"
want="$(sha256sum "$req" | cut -d' ' -f1)"

if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]]; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
    { echo "validate: needs python3 >= 3.11 with venv (Debian: apt-get install python3-venv)" >&2; exit 2; }
  echo "validate: installing the pinned validator into $venv (once)" >&2
  python3 -m venv --clear "$venv" >&2 ||
    { echo "validate: cannot create a venv (Debian: apt-get install python3-venv)" >&2; exit 2; }
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: -r "$req" >&2 ||
    { echo "validate: installing $req failed (PyPI unreachable?)" >&2; exit 2; }
  echo "$want" >"$venv/.requirements.sha256"
fi

(($#)) || set -- "$here"/*.yaml
exec "$venv/bin/python" "$here/validate.py" "$@"
