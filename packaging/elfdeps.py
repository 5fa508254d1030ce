#!/usr/bin/env python3
"""The Debian architecture and Depends of an ELF binary, read from the file.

    elfdeps.py BINARY   ->  prints two lines: "amd64" and
                            "libc6 (>= 2.34), libgcc-s1 (>= 4.2.0)"

What dpkg-shlibdeps would compute for sluice, without dpkg-dev: the shared
libraries the binary needs (DT_NEEDED) and the newest symbol version it
needs from each (.gnu.version_r), mapped to the Debian packages that ship
them. A library this script does not know is an error, so that a new
dependency cannot slip into the package unnoticed. Standard library only.
"""

import struct
import sys

# soname -> (Debian package, symbol-version prefix whose newest is the minimum)
PACKAGES = {
    "libc.so.6": ("libc6", "GLIBC_"),
    "libm.so.6": ("libc6", "GLIBC_"),
    "libpthread.so.0": ("libc6", "GLIBC_"),
    "libdl.so.2": ("libc6", "GLIBC_"),
    "librt.so.1": ("libc6", "GLIBC_"),
    "libutil.so.1": ("libc6", "GLIBC_"),
    "ld-linux-x86-64.so.2": ("libc6", "GLIBC_"),
    "ld-linux-aarch64.so.1": ("libc6", "GLIBC_"),
    "libgcc_s.so.1": ("libgcc-s1", "GCC_"),
}

ARCHES = {62: "amd64", 183: "arm64"}  # e_machine: EM_X86_64, EM_AARCH64

SHT_DYNAMIC = 6
SHT_GNU_VERNEED = 0x6FFFFFFE
DT_NEEDED = 1


def version_key(text):
    return tuple(int(p) if p.isdigit() else 0 for p in text.split("."))


def read_elf(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit("%s: not a 64-bit little-endian ELF file" % path)
    (e_machine,) = struct.unpack_from("<H", data, 18)
    e_shoff, = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 58)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        (name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link, sh_info,
         _align, sh_entsize) = struct.unpack_from("<IIQQQQIIQQ", data, off)
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_info, sh_entsize))

    def string(section_index, offset):
        start = sections[section_index][1] + offset
        end = data.index(b"\0", start)
        return data[start:end].decode()

    needed = []
    versions = {}  # soname -> [version names]
    for sh_type, offset, size, link, info, entsize in sections:
        if sh_type == SHT_DYNAMIC:
            for pos in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == DT_NEEDED:
                    needed.append(string(link, value))
        elif sh_type == SHT_GNU_VERNEED:
            pos = offset
            for _ in range(info):
                _ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", data, pos)
                soname = string(link, file_off)
                apos = pos + aux
                for _ in range(cnt):
                    _hash, _flags, _other, name_off, anext = struct.unpack_from("<IHHII", data, apos)
                    versions.setdefault(soname, []).append(string(link, name_off))
                    apos += anext
                pos += nxt
    return ARCHES.get(e_machine), needed, versions


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    arch, needed, versions = read_elf(argv[1])
    if arch is None:
        sys.stderr.write("%s: unknown machine type\n" % argv[1])
        return 1
    minimum = {}  # package -> newest version needed
    order = []
    for soname in needed:
        if soname not in PACKAGES:
            sys.stderr.write("%s needs %s, which elfdeps.py cannot map to a "
                             "Debian package: add it to PACKAGES\n" % (argv[1], soname))
            return 1
        package, prefix = PACKAGES[soname]
        if package not in order:
            order.append(package)
        for name in versions.get(soname, []):
            if name.startswith(prefix):
                number = name[len(prefix):]
                if package not in minimum or version_key(number) > version_key(minimum[package]):
                    minimum[package] = number
    depends = [
        "%s (>= %s)" % (p, minimum[p]) if p in minimum else p for p in sorted(order)
    ]
    print(arch)
    print(", ".join(depends))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
