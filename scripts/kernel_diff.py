#!/usr/bin/env python3
"""Compares the machine code of every kernel in two cubins (no cuobjdump needed).

    nvcc -cubin -arch=sm_90 … inst.cu -o before.cubin   (same TU, before and after a change)
    scripts/kernel_diff.py before.cubin after.cubin

Per kernel (.text.* section): identical; same size with the instructions that differ only
in their 32-bit immediate field (constants, e.g. status bits); or a different size. Made
to show that a refactor left the kernels' code alone, which a benchmark cannot prove.
"""
import re
import struct
import subprocess
import sys


def text_sections(path):
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    name = lambda off: data[names + off: data.index(b"\0", names + off)].decode()
    # A kernel in an anonymous namespace is named with a hash of its file's path: the same
    # kernel of two trees (a worktree beside the checkout) gets two names without this. The
    # hash keeps its length, so that the name still demangles.
    anon = lambda n: re.sub(r"_GLOBAL__N__[0-9a-f]{8}_", "_GLOBAL__N__00000000_", n)
    return {anon(name(s[0])[6:]): data[s[4]: s[4] + s[5]] for s in sections if name(s[0]).startswith(".text.")}


def main():
    before, after = text_sections(sys.argv[1]), text_sections(sys.argv[2])
    for kernel in sorted(set(before) | set(after)):
        shown = subprocess.run(["c++filt"], input=kernel, capture_output=True, text=True).stdout.strip()[:100]
        if kernel not in before or kernel not in after:
            print(f"only {'after ' if kernel in after else 'before'}               {shown}")
            continue
        x, y = before[kernel], after[kernel]
        if x == y:
            print(f"identical   {len(x) // 16:6d} instr   {shown}")
        elif len(x) != len(y):
            print(f"SIZE {len(x) // 16:6d} -> {len(y) // 16:6d} instr {shown}")
        else:
            differ = [i for i in range(0, len(x), 16) if x[i:i + 16] != y[i:i + 16]]
            immediate = sum(1 for i in differ if x[i:i + 4] == y[i:i + 4] and x[i + 8:i + 16] == y[i + 8:i + 16])
            print(f"same size   {len(x) // 16:6d} instr, {len(differ)} differ ({immediate} only in the immediate) {shown}")


if __name__ == "__main__":
    main()
