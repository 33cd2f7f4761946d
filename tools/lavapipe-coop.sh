#!/usr/bin/env bash
# Lavapipe with cooperative matrices, for running dg's tensor-core kernels (the F16 and quantized
# modes' products) on a machine without a GPU.
#
# Mesa's CPU Vulkan driver offers VK_KHR_cooperative_matrix (8x8x8 fragments, f16 -> f32, subgroups
# of 8) from about Mesa 25.1; Debian's stable release has an older one. This script takes the
# driver from Debian's development suite (sid) with every library it depends on, the C library
# included, and unpacks them into DIR: nothing outside DIR is installed or changed. A program runs
# under it through that C library's loader, so only programs started directly get the driver (not
# the processes they start).
#
#   tools/lavapipe-coop.sh DIR              fetch and unpack into DIR (once; again after deleting DIR)
#   tools/lavapipe-coop.sh DIR -- CMD ...   then run CMD under it
#
# As a cargo runner, for the dg-parity tests (DG_REQUIRE_TENSOR_CORES=1 makes a test that would
# skip for want of cooperative matrices fail instead):
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/tools/lavapipe-coop.sh $PWD/.lavapipe --" \
#   DG_REQUIRE_TENSOR_CORES=1 cargo test --release -p dg-parity --test tensor_cores
#
# Exit status 3 when the driver cannot be fetched (the caller decides what that means).
set -euo pipefail

dir=${1:?usage: tools/lavapipe-coop.sh DIR [-- CMD ...]}
shift
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
root=$dir/root
libs=$root/usr/lib/x86_64-linux-gnu

fetch() {
    local apt=$dir/apt
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$dir/debs"
    cat > "$apt/sid.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    local opts=(-o "Dir::Etc::sourcelist=$apt/sid.sources" -o Dir::Etc::sourceparts=/dev/null
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Dir::State::status=/dev/null
        -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" -qq update
    # The driver and everything it depends on, as apt resolves it in sid.
    local packages
    packages=$(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances mesa-vulkan-drivers | grep '^[a-z0-9]' | sort -u)
    (cd "$dir/debs" && apt-get "${opts[@]}" -qq download $packages)
    rm -rf "$root.partial"
    mkdir -p "$root.partial"
    for deb in "$dir"/debs/*.deb; do
        dpkg-deb -x "$deb" "$root.partial"
    done
    mv "$root.partial" "$root"
    echo "lavapipe-coop: Mesa $(dpkg-deb -f "$dir"/debs/mesa-vulkan-drivers_*.deb Version)"
}

if [ ! -x "$libs/ld-linux-x86-64.so.2" ] || [ ! -e "$libs/libvulkan_lvp.so" ]; then
    echo "lavapipe-coop: fetching Mesa's lavapipe from Debian sid into $dir" >&2
    if ! fetch >&2; then
        echo "lavapipe-coop: could not fetch the driver (network, or sid's packages moved)" >&2
        exit 3
    fi
fi
sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$libs/libvulkan_lvp.so\"#" \
    "$root/usr/share/vulkan/icd.d/lvp_icd.json" > "$dir/lvp_icd.json"

export VK_DRIVER_FILES=$dir/lvp_icd.json
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
run=("$libs/ld-linux-x86-64.so.2" --library-path "$libs:$root/lib/x86_64-linux-gnu")
if [ "${1:-}" != "--" ]; then
    echo "lavapipe-coop: ready in $dir; run a program under it with: tools/lavapipe-coop.sh $dir -- CMD ..." >&2
    exit 0
fi
shift
exec "${run[@]}" "$@"
