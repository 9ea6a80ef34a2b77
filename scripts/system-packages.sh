#!/usr/bin/env bash
# Install Debian packages Hydra Lab can use, when apt is available and we may use it.
#   scripts/system-packages.sh data      Fashion-MNIST (dataset-fashion-mnist), the default ID set
#   scripts/system-packages.sh browser   chromium + chromium-driver, for the browser test
# Without apt (or root/sudo) it prints what to do instead and exits 0: Fashion-MNIST then comes from
# $HYDRA_FASHION_MNIST_DIR or torchvision's download when online.
set -euo pipefail
what="${1:-data}"
case "$what" in
  data)    packages=(dataset-fashion-mnist); present() { [ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; } ;;
  browser) packages=(chromium chromium-driver); present() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; } ;;
  *) echo "usage: $0 data|browser" >&2; exit 2 ;;
esac
present && exit 0
if ! command -v apt-get >/dev/null; then
  echo "note: apt-get not found; install ${packages[*]} yourself (see docs/index.md)." >&2; exit 0
fi
if [ "$(id -u)" -eq 0 ]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n); else
  echo "note: not root and no passwordless sudo; run: sudo apt-get install ${packages[*]}" >&2; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# An update only when the package lists do not know the packages yet.
if ! apt-cache show "${packages[0]}" >/dev/null 2>&1; then "${sudo[@]}" apt-get update -q; fi
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${packages[@]}"
