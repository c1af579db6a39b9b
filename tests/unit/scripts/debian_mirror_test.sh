#!/usr/bin/env bash
# scripts/debian-mirror.sh finds the Debian archive in apt sources of every
# shape (one-line with options, deb822 with comments, embedded keys and
# disabled stanzas), skips security and third-party repositories, lets
# DISTRAIN_DEBIAN_MIRROR win, and fails naming DISTRAIN_DEBIAN_MIRROR when
# nothing matches. No network; each case is a fake /etc/apt in a temp dir.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
SCRIPT="$ROOT/scripts/debian-mirror.sh"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
failures=0
printf 'ID=debian\nVERSION_CODENAME=bookworm\n' >"$T/os-release"
export DISTRAIN_OS_RELEASE="$T/os-release"
unset DISTRAIN_DEBIAN_MIRROR

# expect NAME WANT: runs the script on $T/NAME; WANT is the URI, or "error".
expect() {
  local name="$1" want="$2" out rc
  out="$("$SCRIPT" "$T/$name" 2>"$T/$name.err")"
  rc=$?
  if [ "$want" = error ]; then
    if [ "$rc" = 0 ]; then
      echo "FAIL: $name: printed '$out', want an error"; failures=$((failures + 1))
    elif ! grep -q DISTRAIN_DEBIAN_MIRROR "$T/$name.err"; then
      echo "FAIL: $name: the error does not name DISTRAIN_DEBIAN_MIRROR: $(cat "$T/$name.err")"
      failures=$((failures + 1))
    else
      echo "ok: $name: error naming DISTRAIN_DEBIAN_MIRROR"
    fi
  elif [ "$rc" != 0 ] || [ "$out" != "$want" ]; then
    echo "FAIL: $name: got '$out' (exit $rc; $(cat "$T/$name.err")), want '$want'"
    failures=$((failures + 1))
  else
    echo "ok: $name: $out"
  fi
}
mk() { mkdir -p "$T/$1/sources.list.d"; }

# One-line format: comments, options in brackets (with spaces), a security
# line first, a trailing slash.
mk oneline
cat >"$T/oneline/sources.list" <<'EOF'
# deb http://commented.example/debian bookworm main
deb [ arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg ] http://security.example/debian-security bookworm-security main
deb [arch=amd64] http://mirror.example.org/debian/ bookworm main contrib
EOF
expect oneline http://mirror.example.org/debian

# deb822 (Debian 12's default file) behind a proxy, with a comment inside the
# stanza, an embedded key as continuation lines, and a disabled stanza first.
mk deb822
cat >"$T/deb822/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://apt-proxy.internal:3142/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBGPL0BUBEADmW5NdOOHwPIJlgPu6JDcKw/NZJPR8lsD9K7pgDDs7nbVqMsRh
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
EOF
expect deb822 http://apt-proxy.internal:3142/debian

# Only third-party and security repositories: nothing Debian's to use.
mk thirdparty
echo "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main" >"$T/thirdparty/sources.list.d/google.list"
cat >"$T/thirdparty/sources.list.d/nodesource.sources" <<'EOF'
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
EOF
echo "deb http://deb.debian.org/debian-security bookworm-security main" >"$T/thirdparty/sources.list"
expect thirdparty error

# sources.list comes before sources.list.d, and .list/.sources files in name order;
# a Debian alias (stable) counts; files with other suffixes are not read.
mk order
echo "deb https://deb.nodesource.com/node_20.x nodistro main" >"$T/order/sources.list"
echo "deb http://second.example/debian stable main" >"$T/order/sources.list.d/b.list"
printf 'Types: deb\nURIs: http://first.example/debian\nSuites: bookworm-backports\nComponents: main\n' \
  >"$T/order/sources.list.d/a.sources"
echo "deb http://ignored.example/debian bookworm main" >"$T/order/sources.list.d/0.list.disabled"
expect order http://first.example/debian

# Nothing at all.
mk empty
expect empty error

# The variable wins over the files.
out="$(DISTRAIN_DEBIAN_MIRROR=http://override.example/debian "$SCRIPT" "$T/oneline")"
if [ "$out" = http://override.example/debian ]; then
  echo "ok: DISTRAIN_DEBIAN_MIRROR wins"
else
  echo "FAIL: DISTRAIN_DEBIAN_MIRROR ignored: got '$out'"
  failures=$((failures + 1))
fi

[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "PASS"
