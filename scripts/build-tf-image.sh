#!/usr/bin/env bash
# Builds the example of a user's own TensorFlow image, the one
# examples/tensorflow-*.yaml and the e2e test e2e.tensorflow_image run:
#
#   localhost/distrain/tensorflow-example:<TF version>-<hash>
#     = distrain's Debian 12 base (scripts/build-images.sh --base-only)
#       + Debian's python3 + tensorflow-cpu and tf-keras from PyPI (pinned below)
#       + examples/tensorflow/*.py under /app, user 65532
#     from examples/tensorflow/Containerfile, with buildah. Nothing of distrain
#     is in it: the operator only gives its pods TF_CONFIG.
#
#   scripts/build-tf-image.sh            build it, or find it cached; prints "IMAGE ARCHIVE"
#   scripts/build-tf-image.sh --import   also import it into the real node's containerd
#                                        (scripts/node.sh import), tagged :<TF version>
#                                        too, the tag the examples name
#   scripts/build-tf-image.sh --print    prints "IMAGE ARCHIVE", builds nothing (exit 3
#                                        while the archive is not cached)
#
# Caches, under ${DISTRAIN_CACHE:-~/.cache/distrain}:
#   tf-wheels-<TF version>/     the wheels, downloaded once from PyPI for Debian 12's
#                               python (cp311, manylinux x86_64) with `pip download`;
#                               requirements.lock lists them. Installed offline:
#                               bind-mounted into the build, never a layer.
#   images/tensorflow-example-<tag>.oci.tar
#                               the built image. The tag's hash covers the versions,
#                               the Containerfile, the scripts and the base's name, so
#                               a warm run finds the archive and runs no buildah at
#                               all; an older archive is removed when a new one is made.
# Cold: the wheels (~300 MB) and Debian's python3 are downloaded, then a few
# minutes of install and export. Needs root (buildah's store), buildah, and a
# Python with pip for the download.
#
# Environment: DISTRAIN_CACHE, PYTHON (runs `pip download`; default python3, else
#   scripts/setup.sh's ~/.cache/distrain/peers-venv),
#   DISTRAIN_NODE_SH (default scripts/node.sh, for --import).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

TF_VERSION=2.21.0
TF_KERAS_VERSION=2.21.0   # tf-keras is released with each TensorFlow version
PY_TAG=311                # Debian 12's python3 (3.11); the wheels must match it
RECIPE=1                  # bump when this script changes what the image holds

NAME=localhost/distrain/tensorflow-example
SRC="$ROOT/examples/tensorflow"
SCRIPTS=(mnist_setup.py mnist_mwms.py mnist_ps.py)
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
WHEELS="$CACHE/tf-wheels-$TF_VERSION"
IMAGES_CACHE="$CACHE/images"
NODE_SH="${DISTRAIN_NODE_SH:-$ROOT/scripts/node.sh}"
log() { printf '[tf-image] %s\n' "$*" >&2; }
die() { printf 'build-tf-image.sh: %s\n' "$*" >&2; exit 1; }

MODE=build
IMPORT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --import) IMPORT=1; shift ;;
    --print) MODE=print; shift ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-tf-image.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

BASE_IMAGE="$("$ROOT/scripts/build-images.sh" --print-base)"
KEY=$( { printf '%s\n' "$RECIPE" "$TF_VERSION" "$TF_KERAS_VERSION" "$PY_TAG" "$BASE_IMAGE"
         cat "$SRC/Containerfile" "${SCRIPTS[@]/#/$SRC/}"; } | sha256sum | cut -c1-12)
TAG="$TF_VERSION-$KEY"
IMAGE="$NAME:$TAG"
ARCHIVE="$IMAGES_CACHE/tensorflow-example-$TAG.oci.tar"

if [ "$MODE" = print ]; then
  echo "$IMAGE $ARCHIVE"
  [ -f "$ARCHIVE" ] || exit 3
  exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (buildah's store, the node's containerd); run it with sudo"
mkdir -p "$IMAGES_CACHE"
# One build at a time per cache: a second waits, then finds the archive.
exec 9>"$IMAGES_CACHE/tensorflow-example.lock"
flock 9

# The wheels for Debian 12's python, whatever Python runs pip here: every
# manylinux tag glibc 2.36 (bookworm) runs, listed, as pip only expands the
# legacy manylinux aliases itself.
fetch_wheels() {
  [ -f "$WHEELS/requirements.lock" ] && return 0
  local py tmp="$WHEELS.tmp.$$" v
  # Any Python with pip: Debian's python3 has none without python3-pip, the
  # venv scripts/setup.sh makes for the TensorFlow peers has one.
  for py in ${PYTHON:-} python3 "$CACHE/peers-venv/bin/python" ""; do
    [ -n "$py" ] && "$py" -m pip --version >/dev/null 2>&1 && break
  done
  [ -n "$py" ] || die "no Python with pip to download the wheels (set PYTHON, or apt-get install python3-pip)"
  local target=(--only-binary=:all: --python-version "${PY_TAG:0:1}.${PY_TAG:1}" --implementation cp
                --abi "cp$PY_TAG" --platform manylinux2014_x86_64)
  for v in $(seq 36 -1 17); do target+=(--platform "manylinux_2_${v}_x86_64"); done
  rm -rf "$tmp"
  log "downloading tensorflow-cpu $TF_VERSION and tf-keras $TF_KERAS_VERSION wheels into $WHEELS (once)"
  "$py" -m pip download --quiet --no-cache-dir --disable-pip-version-check "${target[@]}" -d "$tmp" \
    "tensorflow-cpu==$TF_VERSION" || die "pip download tensorflow-cpu==$TF_VERSION failed"
  # Without its dependencies: it names `tensorflow`, which tensorflow-cpu stands in for.
  "$py" -m pip download --quiet --no-cache-dir --disable-pip-version-check "${target[@]}" -d "$tmp" \
    --no-deps "tf-keras==$TF_KERAS_VERSION" || die "pip download tf-keras==$TF_KERAS_VERSION failed"
  (cd "$tmp" && ls -1 ./*.whl | sed 's#^\./##' | sort >requirements.lock)
  mv "$tmp" "$WHEELS"
  log "wheels: $(wc -l <"$WHEELS/requirements.lock") files, $(du -sh "$WHEELS" | cut -f1)"
}

if [ -f "$ARCHIVE" ]; then
  log "$IMAGE: cached $ARCHIVE"
else
  command -v buildah >/dev/null || die "buildah is missing; run scripts/setup.sh"
  start=$SECONDS
  fetch_wheels
  BASE_IMAGE="$("$ROOT/scripts/build-images.sh" --base-only)" || die "scripts/build-images.sh --base-only failed"
  read -r -a STORAGE < <("$ROOT/scripts/build-images.sh" --print-storage)
  B=(buildah "${STORAGE[@]}")
  WORK="$(mktemp -d "$IMAGES_CACHE/tf-work.XXXXXX")"
  trap 'rm -rf --one-file-system "$WORK"' EXIT
  # Build context: the wheels (hard links, same filesystem) and the scripts.
  cp -al "$WHEELS" "$WORK/wheels" 2>/dev/null || cp -a "$WHEELS" "$WORK/wheels"
  cp "${SCRIPTS[@]/#/$SRC/}" "$WORK/"
  log "building $IMAGE on $BASE_IMAGE"
  "${B[@]}" bud --layers=false --pull=never --isolation chroot \
    --build-arg BASE="$BASE_IMAGE" --build-arg TF_VERSION="$TF_VERSION" \
    --build-arg TF_KERAS_VERSION="$TF_KERAS_VERSION" \
    --label org.opencontainers.image.version="$TAG" \
    --label io.distrain.tensorflow="tensorflow-cpu $TF_VERSION, tf-keras $TF_KERAS_VERSION" \
    -f "$SRC/Containerfile" -t "$IMAGE" "$WORK" >"$WORK/build.log" 2>&1 ||
    { tail -n 30 "$WORK/build.log" >&2; die "buildah bud failed (its last lines are above)"; }
  grep -E '^tensorflow ' "$WORK/build.log" | sed 's/^/[tf-image] in the image: /' >&2 || true
  log "built in $((SECONDS - start)) s; exporting $ARCHIVE"
  "${B[@]}" push --quiet "$IMAGE" "oci-archive:$ARCHIVE.tmp:$IMAGE" >/dev/null
  mv "$ARCHIVE.tmp" "$ARCHIVE"
  # The archive is the cache: the store's copy (and any older archive) goes.
  "${B[@]}" rmi "$IMAGE" >/dev/null 2>&1 || true
  for old in "$IMAGES_CACHE"/tensorflow-example-*.oci.tar; do
    [ "$old" = "$ARCHIVE" ] || rm -f "$old"
  done
  log "$IMAGE: $(du -h "$ARCHIVE" | cut -f1) archive, $((SECONDS - start)) s in all"
fi

if [ "$IMPORT" = 1 ]; then
  "$NODE_SH" status >/dev/null 2>&1 || die "the node is not up (scripts/node.sh up)"
  if "$NODE_SH" ctr images ls -q | grep -qx "$IMAGE"; then
    log "$IMAGE: already in the node's containerd"
  else
    start=$SECONDS
    "$NODE_SH" import "$ARCHIVE" >&2 || die "scripts/node.sh import $ARCHIVE failed"
    log "imported into the node's containerd in $((SECONDS - start)) s"
  fi
  "$NODE_SH" ctr images tag --force "$IMAGE" "$NAME:$TF_VERSION" >/dev/null ||
    die "tagging $IMAGE as $NAME:$TF_VERSION in the node's containerd failed"
fi
echo "$IMAGE $ARCHIVE"
