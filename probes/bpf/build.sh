#!/usr/bin/env bash
# Builds the tame congestion control (tame_cc.bpf.c) for the running kernel into OUT (a BPF object).
# vmlinux.h comes from this kernel's BTF at build time, so the object matches the kernel it is loaded into.
# Needs clang and bpftool (and libbpf-dev's headers): scripts/install-system-deps.sh installs them.
# Usage: build.sh OUT      (probes/cc.py calls it at first use and caches OUT by source and kernel BTF)
set -euo pipefail
out=${1:?usage: build.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bpftool btf dump file /sys/kernel/btf/vmlinux format c > "$work/vmlinux.h"
arch=$(uname -m)
case "$arch" in
    x86_64) target_arch=x86 ;;
    aarch64) target_arch=arm64 ;;
    *) target_arch=$arch ;;
esac
clang -target bpf -O2 -g -Wall -D__TARGET_ARCH_"$target_arch" -I"$work" -c "$here/tame_cc.bpf.c" -o "$work/tame_cc.bpf.o"
mv "$work/tame_cc.bpf.o" "$out"
