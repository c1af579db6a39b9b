#!/usr/bin/env bash
# Prints the URI of the Debian archive this machine's apt already uses (e.g.
# http://deb.debian.org/debian, http://apt-cacher:3142/debian,
# mirror+file:/etc/apt/mirrors/debian.list), so scripts/setup.sh can fetch
# source packages from the same mirror or proxy instead of a hard-coded host.
#
#   scripts/debian-mirror.sh [APT_ETC_DIR]     (default /etc/apt)
#
# DISTRAIN_DEBIAN_MIRROR, when set, wins and is printed as is. Otherwise the
# first enabled deb or deb-src entry whose suite is the release's own
# (VERSION_CODENAME of ${DISTRAIN_OS_RELEASE:-/etc/os-release}, or its
# -updates/-backports/-proposed-updates; never -security, whose archive has no
# other releases) or a Debian alias (stable, testing, unstable, sid...), in
# apt's order: sources.list, then sources.list.d/*.list and the deb822
# *.sources, sorted by name. Third-party repositories never match: their
# suites are not Debian's. Exits 1 with a message naming what to set when
# nothing matches.
set -euo pipefail

if [ -n "${DISTRAIN_DEBIAN_MIRROR:-}" ]; then
  echo "$DISTRAIN_DEBIAN_MIRROR"
  exit 0
fi
etc="${1:-/etc/apt}"
os_release="${DISTRAIN_OS_RELEASE:-/etc/os-release}"
codename=""
if [ -r "$os_release" ]; then
  codename="$(. "$os_release" && echo "${VERSION_CODENAME:-}")"
fi

files=()
[ -f "$etc/sources.list" ] && files+=("$etc/sources.list")
if [ -d "$etc/sources.list.d" ]; then
  while IFS= read -r f; do files+=("$f"); done < <(
    find "$etc/sources.list.d" -maxdepth 1 -type f \( -name '*.list' -o -name '*.sources' \) | LC_ALL=C sort)
fi

mirror=""
if [ ${#files[@]} -gt 0 ]; then
  # Each file is parsed as one-line (.list) or deb822 (.sources) format; the
  # awk program prints "URI SUITE" for every enabled deb/deb-src entry.
  mirror="$(for f in "${files[@]}"; do
    case "$f" in
      *.sources) fmt=deb822 ;;
      *) fmt=line ;;
    esac
    awk -v fmt="$fmt" '
      function flush(   n, m, u, s, i, j, types, uris, suites, ok) {
        if (fmt != "deb822" || !have) { have = 0; return }
        ok = (tolower(f["enabled"]) != "no")
        n = split(f["types"], types, /[ \t]+/)
        t = 0
        for (i = 1; i <= n; i++) if (types[i] == "deb" || types[i] == "deb-src") t = 1
        if (ok && t) {
          m = split(f["uris"], uris, /[ \t]+/)
          n = split(f["suites"], suites, /[ \t]+/)
          for (i = 1; i <= m; i++) for (j = 1; j <= n; j++)
            if (uris[i] != "" && suites[j] != "") print uris[i], suites[j]
        }
        delete f; have = 0; cur = ""
      }
      fmt == "line" {
        sub(/#.*/, "")
        if ($1 != "deb" && $1 != "deb-src") next
        # Options: "[arch=amd64 signed-by=...]", possibly spread over fields.
        i = 2
        if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if (i + 1 <= NF) print $i, $(i + 1)
        next
      }
      /^#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ {            # a continuation line of the field before it
        if (cur != "") { v = $0; sub(/^[ \t]+/, "", v); f[cur] = f[cur] " " v }
        next
      }
      {
        k = tolower($0); sub(/:.*/, "", k)
        v = $0; sub(/^[^:]*:[ \t]*/, "", v)
        cur = ""
        if (k == "types" || k == "uris" || k == "suites" || k == "enabled") { f[k] = v; cur = k; have = 1 }
      }
      END { flush() }' "$f"
  done | awk -v codename="$codename" '
    function debian_suite(s) {
      if (s ~ /-security$/ || s ~ /\/updates$/) return 0
      if (s ~ /^(oldoldstable|oldstable|stable|testing|unstable|sid|experimental)(-updates|-backports|-proposed-updates)?$/) return 1
      if (codename == "") return 0
      return s == codename || s == codename "-updates" || s == codename "-backports" || s == codename "-proposed-updates"
    }
    $1 !~ /^cdrom:/ && debian_suite($2) { print $1; exit }')"
fi

if [ -z "$mirror" ]; then
  {
    echo "debian-mirror.sh: found no Debian archive in $etc/sources.list, $etc/sources.list.d/*.list or *.sources"
    echo "  (an enabled deb or deb-src entry for suite '${codename:-<VERSION_CODENAME>}' or a Debian alias such as stable)."
    echo "  Set DISTRAIN_DEBIAN_MIRROR to a Debian archive apt can reach from here"
    echo "  (e.g. DISTRAIN_DEBIAN_MIRROR=http://deb.debian.org/debian, or your mirror or proxy) and re-run."
  } >&2
  exit 1
fi
# One-line entries may end a URI with "/"; apt does not care, but keep it tidy.
echo "${mirror%/}"
