#!/usr/bin/env bash
# `make test-editors`: the VS Code extension inside a real VS Code (vscode.mjs). Gets what it
# needs first: Node 24 (code-server's engine) from the npm registry's `node` package into
# tests/editors/.node unless `node` is already 24, code-server and playwright-core from this
# folder's lockfile (their native modules built against that Node), the extension's .vsix
# (`make vsix`). Without a part it cannot get here (npm, Chromium, the build tools code-server's
# native modules need) it skips, saying which and how to get it; EDITORS_REQUIRED=1 makes a skip
# a failure. Every step is bounded.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
top="$(cd "$here/../.." && pwd)"
NODE24_VERSION="${NODE24_VERSION:-24.21.0}"
budget="${EDITORS_BUDGET_S:-240}"
export EDITORS_BUDGET_S="$budget"

skip() {
  echo "test-editors: SKIPPED: $*"
  if [ "${EDITORS_REQUIRED:-0}" = 1 ]; then exit 1; fi
  exit 0
}

command -v npm >/dev/null 2>&1 || skip "npm not found (Debian: apt-get install npm)"
command -v git >/dev/null 2>&1 || skip "git not found"

# Chromium, driven through playwright-core with its executablePath (no browser download).
chromium="${CHROMIUM:-}"
if [ -z "$chromium" ]; then
  for c in /usr/lib/chromium/chromium "$(command -v chromium 2>/dev/null)" "$(command -v chromium-browser 2>/dev/null)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then chromium="$c"; break; fi
  done
fi
[ -n "$chromium" ] && [ -x "$chromium" ] \
  || skip "Chromium not found${chromium:+ at $chromium} (Debian: apt-get install chromium; or CHROMIUM=/path/to/chrome)"

# What code-server's native modules (node-gyp: kerberos, node-pty, spdlog, ...) are built with.
missing=()
for tool in make g++ python3 pkg-config; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
[ -e /usr/include/gssapi/gssapi.h ] || missing+=("gssapi/gssapi.h")
if [ ${#missing[@]} -gt 0 ] && [ ! -e "$here/node_modules/.package-lock.json" ]; then
  skip "code-server's native modules cannot be built: missing ${missing[*]} (Debian: apt-get install build-essential pkg-config python3 libkrb5-dev)"
fi

# Node 24.
major() { "$1" -e 'process.stdout.write(process.versions.node.split(".")[0])' 2>/dev/null || true; }
node24=""
if [ "$(major node)" = 24 ]; then
  node24="$(command -v node)"
else
  node24="$here/.node/node_modules/node/bin/node"
  if [ "$(major "$node24")" != 24 ]; then
    echo "test-editors: installing node@$NODE24_VERSION into tests/editors/.node"
    mkdir -p "$here/.node"
    if ! out="$(timeout 300 npm install --prefix "$here/.node" --no-audit --no-fund --no-save "node@$NODE24_VERSION" 2>&1)" \
      || [ "$(major "$node24")" != 24 ]; then
      echo "$out" | tail -20
      skip "Node 24 could not be installed from the npm registry (npm install node@$NODE24_VERSION)"
    fi
  fi
fi
echo "test-editors: node $("$node24" --version) ($node24), chromium $chromium"

# code-server and playwright-core, from the lockfile, with Node 24 first on PATH (npm, node-gyp and
# code-server's postinstall run on it), its own headers for node-gyp (the registry's package ships
# them; a configured nodedir may hold another Node's).
node24_path="$(dirname "$node24"):$PATH"
for d in "$(dirname "$node24")/.." "$(dirname "$node24")"/../node_modules/node-linux-*; do
  if [ -e "$d/include/node/node_version.h" ]; then export npm_config_nodedir="$(cd "$d" && pwd)"; break; fi
done
if [ ! -e "$here/node_modules/.package-lock.json" ] || [ "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]; then
  echo "test-editors: npm ci (code-server, playwright-core; native modules build: a few minutes)"
  (cd "$here" && PATH="$node24_path" timeout 900 npm ci --no-audit --no-fund --loglevel=error)
fi

# The extension's package, built as `make vsix` builds it (on the machine's own Node).
(cd "$top" && timeout 300 "${MAKE:-make}" --no-print-directory vsix)
vsix="$top/clients/vscode/xum-vscode.vsix"

XUMD="${XUMD:-$top/.venv/bin/xumd}" VSIX="$vsix" CHROMIUM="$chromium" \
  timeout -k 10 "$((budget + 30))" "$node24" "$here/vscode.mjs"
