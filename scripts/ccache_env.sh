# Sourced by scripts/build.sh and scripts/fuzz.sh from the repository root:
# compiler outputs cached across clones under the project cache (ccache,
# installed by scripts/setup.sh), keyed by the preprocessed source, the
# compiler and the flags; paths below the repository are hashed relative to
# it, so a fresh clone anywhere reuses them. Sets CCACHE_LAUNCHER to the CMake
# arguments that use it (empty without ccache).
CCACHE_LAUNCHER=()
if command -v ccache > /dev/null; then
  export CCACHE_DIR="${CCACHE_DIR:-${DISTRAIN_CACHE:-$HOME/.cache/distrain}/ccache}"
  export CCACHE_BASEDIR="$PWD"
  export CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-4G}"
  CCACHE_LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
