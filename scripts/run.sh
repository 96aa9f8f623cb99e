#!/usr/bin/env bash
# Builds and serves the web page on http://127.0.0.1:8080, or builds and starts the desktop app.
#   scripts/run.sh            the page (static files only: the simulator runs in the browser)
#   scripts/run.sh --desktop  the native desktop app (GLFW + OpenGL 3.3)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/deps.sh" --build
if [ "${1:-}" = "--desktop" ]; then
  shift
  "$here/scripts/build.sh" native
  exec "$here/build/native/memsim" "$@"
fi
"$here/scripts/build.sh" web
port="${MEMSIM_PORT:-8080}"
echo "memsim: serving http://127.0.0.1:$port"
exec python3 "$here/scripts/serve.py" "$here/build/web/site" "$port"
