#!/usr/bin/env bash
# Builds sluice's Debian package from a staged tree with dpkg-deb (no
# cargo-deb): OUT/sluice_VERSION_ARCH.deb, OUT defaulting to target/package.
#
#   scripts/package.sh [--bin PATH] [--out DIR] [--compress xz|gzip|zstd|none]
#
# BIN, OUT and DEB_COMPRESS in the environment do the same. BIN defaults to
# target/release/sluice (`make package` builds it first); the tests package
# target/debug/sluice. Each run starts from an empty stage, so it can be
# repeated. Needs dpkg-deb and gzip (in every Debian) and python3 (the man
# pages and Depends; standard library only); `strip` (binutils) is used
# when present to drop the debug info. Prints the .deb's path.
set -euo pipefail
umask 022

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${BIN:-$root/target/release/sluice}
out=${OUT:-$root/target/package}
compress=${DEB_COMPRESS:-xz}
maintainer=${MAINTAINER:-sluice maintainers <maintainers@users.noreply.a-seed-d840e81f.example>}

usage() { sed -n '2,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --bin) bin=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --compress) compress=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "package.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

die() { echo "package.sh: $*" >&2; exit 1; }
for tool in dpkg-deb gzip python3 md5sum; do
    command -v "$tool" >/dev/null || die "$tool is needed (apt-get install dpkg gzip python3 coreutils)"
done
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
[ -x "$bin" ] || die "no sluice binary at $bin (cargo build --release -p sluice, or --bin PATH)"

# The version of the workspace (crates/sluice takes version.workspace), as
# Debian spells a pre-release (0.2.0-rc.1 -> 0.2.0~rc.1). The binary must
# say the same, or it is stale.
version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml")
[ -n "$version" ] || die "no version in [workspace.package] of $root/Cargo.toml"
built=$("$bin" --version | awk '{print $2}')
[ "$built" = "$version" ] || die "$bin says version $built, Cargo.toml says $version: rebuild it"
deb_version=${version/-/\~}

# Architecture and Depends from the binary itself (as dpkg-shlibdeps would).
deps=$(python3 "$root/packaging/elfdeps.py" "$bin")
arch=$(sed -n 1p <<<"$deps")
depends=$(sed -n 2p <<<"$deps")

# Reproducible: file dates, man page dates and the changelog's from the last
# commit (or $SOURCE_DATE_EPOCH).
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)

mkdir -p "$out"
stage="$out/.stage-sluice_${deb_version}_$arch"
deb="$out/sluice_${deb_version}_$arch.deb"
rm -rf "$stage"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/DEBIAN" "$stage/usr/bin" "$stage/etc/sluice" "$stage/lib/systemd/system" \
    "$stage/usr/share/man/man1" "$stage/usr/share/man/man5" "$stage/usr/share/doc/sluice"

# The binary, without its debug info when strip is here (the release
# profile keeps line tables; the symbol table stays for backtraces).
if [ "${STRIP:-1}" != 0 ] && command -v strip >/dev/null; then
    strip --strip-debug -o "$stage/usr/bin/sluice" "$bin"
    chmod 0755 "$stage/usr/bin/sluice"
else
    install -m 0755 "$bin" "$stage/usr/bin/sluice"
fi
install -m 0644 "$root/packaging/sluice.ini" "$stage/etc/sluice/sluice.ini"
install -m 0644 "$root/packaging/sluice.service" "$stage/lib/systemd/system/sluice.service"

"$bin" --help | python3 "$root/packaging/manpage.py" help "$version" |
    gzip -9n >"$stage/usr/share/man/man1/sluice.1.gz"
python3 "$root/packaging/manpage.py" config "$version" <"$root/docs/config.md" |
    gzip -9n >"$stage/usr/share/man/man5/sluice.ini.5.gz"

install -m 0644 "$root/packaging/debian/copyright" "$stage/usr/share/doc/sluice/copyright"
{
    echo "sluice ($deb_version) unstable; urgency=medium"
    echo
    echo "  * Built from the sluice repository at commit $commit."
    echo
    echo " -- $maintainer  $(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$stage/usr/share/doc/sluice/changelog.gz"

# Control area.
installed_size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s|@VERSION@|$deb_version|" -e "s|@ARCH@|$arch|" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$installed_size|" -e "s|@DEPENDS@|$depends|" \
    "$root/packaging/debian/control.in" >"$stage/DEBIAN/control"
echo /etc/sluice/sluice.ini >"$stage/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "$root/packaging/debian/$script" "$stage/DEBIAN/$script"
done
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\n' | LC_ALL=C sort |
    xargs -d '\n' md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"

find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
rm -f "$deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$stage" "$deb" >/dev/null
echo "$deb"
