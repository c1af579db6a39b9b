# Sourced by the scripts that build pinned Go modules (control-plane.sh,
# kueue.sh, prometheus.sh). find_go WHAT prints the go binary to use: $GO,
# else go in PATH, else /usr/local/go/bin/go; otherwise the caller's die()
# names WHAT and the Go version the caller's $MODULE_DIR/go.mod asks for.
find_go() {
  if [ -n "${GO:-}" ]; then
    command -v "$GO" || die "GO=$GO is not an executable"
  elif command -v go >/dev/null 2>&1; then
    command -v go
  elif [ -x /usr/local/go/bin/go ]; then
    echo /usr/local/go/bin/go
  else
    die "Go is needed to build $1 and was not found (looked in PATH and /usr/local/go/bin). Install Go >= $(awk '$1 == "go" { print $2; exit }' "$MODULE_DIR/go.mod") from https://go.dev/dl/ into /usr/local/go, or set GO=/path/to/go."
  fi
}
