#!/bin/sh
# Compile the kernel sampler's BPF program. The object is committed, so only
# someone changing src/kernel/bpf/*.c needs clang and libbpf-dev
# (scripts/setup-fixtures.sh installs them); tests/kernel_sampler.rs checks
# the committed object is what this script makes from the source.
# Usage: scripts/build-bpf.sh [OUT]   (default: src/kernel/bpf/capture.bpf.o)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
src="$here/src/kernel/bpf/capture.bpf.c"
out="${1:-$here/src/kernel/bpf/capture.bpf.o}"
arch=$(uname -m)
# BTF (for the map definitions), no DWARF, and a fixed file name in the object: the same source gives
# the same bytes on any machine with the same clang.
clang -O2 -g -target bpf -D__TARGET_ARCH_x86 \
	-I "/usr/include/$arch-linux-gnu" \
	-fno-ident -ffile-prefix-map="$here"=. \
	-c "$src" -o "$out.tmp"
llvm-strip -g "$out.tmp" 2>/dev/null || true
mv "$out.tmp" "$out"
