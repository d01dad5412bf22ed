#!/bin/sh
# Compile the kernel sampler's BPF programs: capture.bpf.c (everything aya
# loads) and saved_regs.bpf.c (a task iterator, loaded on its own). The
# objects are committed, so only someone changing src/kernel/bpf/*.c needs
# clang and libbpf-dev (scripts/setup-fixtures.sh installs them);
# tests/kernel_sampler.rs checks the committed objects are what this script
# makes from the sources.
# Usage: scripts/build-bpf.sh [OUTDIR]   (default: src/kernel/bpf)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
outdir="${1:-$here/src/kernel/bpf}"
arch=$(uname -m)
for name in capture saved_regs; do
	src="$here/src/kernel/bpf/$name.bpf.c"
	out="$outdir/$name.bpf.o"
	# BTF (for the map definitions), no DWARF, and a fixed file name in the object: the same source gives
	# the same bytes on any machine with the same clang.
	clang -O2 -g -target bpf -D__TARGET_ARCH_x86 \
		-I "/usr/include/$arch-linux-gnu" \
		-fno-ident -ffile-prefix-map="$here"=. \
		-c "$src" -o "$out.tmp"
	llvm-strip -g "$out.tmp" 2>/dev/null || true
	mv "$out.tmp" "$out"
done
