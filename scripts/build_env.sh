# Sourced by the build scripts: one place for the build directory and ccache settings.
BUILD_DIR="${BUILD_DIR:-build}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ulysses-ccache}"
# Paths relative to the checkout, so a fresh clone elsewhere still hits the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
# RelWithDebInfo compiles with -g, for which ccache hashes the working directory by default:
# every clone (CI's included) would miss. Debug info keeps absolute paths either way.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
