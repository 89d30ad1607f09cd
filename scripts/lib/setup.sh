# Sourced by the scripts in scripts/: installs what is missing from Debian and puts CUDA's
# tools on the PATH. Not a command of its own.

# install_missing PACKAGE…: apt-get installs the packages named (nothing when none are).
install_missing() {
  [ $# -gt 0 ] || return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"
}

# install_build_tools: Debian's catch2, ninja and cmake where they are missing.
install_build_tools() {
  local need=()
  [ -f /usr/include/catch2/catch.hpp ] || need+=(catch2)
  command -v ninja >/dev/null || need+=(ninja-build)
  command -v cmake >/dev/null || need+=(cmake)
  install_missing "${need[@]}"
}

# cuda_on_path: /usr/local/cuda/bin on the PATH where nvcc is not found otherwise.
cuda_on_path() {
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  fi
}
