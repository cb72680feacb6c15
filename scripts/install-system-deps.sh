#!/usr/bin/env bash
# Installs the Debian packages the project runs: iperf3 and libiperf (probes), ns-2 (simulated paths),
# iproute2/nftables/iptables/ethtool/iputils-ping/procps (sysctl) and gcc with libnetfilter-queue (the namespace
# test bed and its NFQUEUE delay line, compiled at first use), and the PostgreSQL server binaries (the tests start a
# throwaway cluster of their own; nothing uses a system cluster), wrk (the load benchmark), and clang, llvm,
# libbpf-dev and bpftool (the tame congestion control, probes/bpf/, built for the running kernel by `make cc`).
# Idempotent: does nothing when all are present.
set -euo pipefail
packages=(iperf3 libiperf0 ns2 iproute2 nftables iptables ethtool iputils-ping procps libnetfilter-queue1 libnetfilter-queue-dev gcc libc6-dev python3-venv postgresql wrk clang llvm libbpf-dev bpftool)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${missing[*]}; run 'sudo $0' or install them with apt-get" >&2
    exit 1
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
