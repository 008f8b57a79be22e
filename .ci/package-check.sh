#!/usr/bin/env bash
# Builds the release .deb and tarball (packaging/build.sh, reusing target/), unpacks the .deb into a temporary
# root with `dpkg -x` and checks what a user would get: the CLI runs and names the commit, the kernels are
# precompiled for sm_90a and sm_120a, the desktop entry validates, icons, tokenizer and licence notices are
# there, and the tarball holds the same binaries. No GPU and no display needed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
passed=0
failed=0

ok() {
    echo "ok   $*"
    passed=$((passed + 1))
}
bad() {
    echo "FAIL $*"
    failed=$((failed + 1))
}
check() {
    local what="$1"
    shift
    if "$@"; then ok "$what"; else bad "$what"; fi
}

apt_install() {
    echo "== installing $* (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
command -v desktop-file-validate >/dev/null 2>&1 || apt_install desktop-file-utils

echo "== packaging/build.sh"
bash packaging/build.sh

shopt -s nullglob
debs=(dist/dsv4-chat_*.deb)
tars=(dist/dsv4-chat-*.tar.gz)
shopt -u nullglob
[[ ${#debs[@]} -eq 1 && ${#tars[@]} -eq 1 ]] || {
    echo "expected one .deb and one .tar.gz in dist/, found: ${debs[*]:-none} ${tars[*]:-none}"
    exit 1
}
deb="${debs[0]}"
tarball="${tars[0]}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
dpkg -x "$deb" "$tmp/root"
r="$tmp/root"

expected="$(git rev-parse --short HEAD)"
git diff --quiet HEAD -- || expected="$expected-dirty"
version_line="$("$r/usr/bin/dsv4" --version || true)"
echo "dsv4 --version: $version_line"
check "dsv4 --version names commit $expected" grep -qF "(commit $expected)" <<<"$version_line"

echo "dsv4 kernels:"
check "dsv4 kernels --require sm_90a,sm_120a,compute_90" \
    "$r/usr/bin/dsv4" kernels --require sm_90a,sm_120a,compute_90
fails() { ! "$@" >/dev/null 2>&1; }
check "dsv4 kernels --require sm_75 fails (the check can fail)" fails "$r/usr/bin/dsv4" kernels --require sm_75

desktop="$r/usr/share/applications/dsv4-chat.desktop"
check "desktop entry validates" desktop-file-validate "$desktop"
check "desktop entry runs dsv4-chat" grep -qx "Exec=dsv4-chat" "$desktop"
check "desktop entry shows icon dsv4-chat" grep -qx "Icon=dsv4-chat" "$desktop"

# PNG width and height are the big-endian u32s at bytes 16 and 20 of the IHDR chunk.
png_is() {
    local file="$1" size="$2"
    [[ -s "$file" ]] && python3 - "$file" "$size" <<'EOF'
import struct, sys
b = open(sys.argv[1], "rb").read(24)
ok = b[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", b[16:24]) == (int(sys.argv[2]),) * 2
sys.exit(0 if ok else 1)
EOF
}
for size in 16 32 48 64 128 256; do
    check "icon ${size}x${size}" png_is "$r/usr/share/icons/hicolor/${size}x${size}/apps/dsv4-chat.png" "$size"
done
check "icon scalable" grep -q '<svg' "$r/usr/share/icons/hicolor/scalable/apps/dsv4-chat.svg"

check "dsv4-chat installed, executable" test -x "$r/usr/bin/dsv4-chat"
check "tokenizer.json identical to assets/" cmp -s "$r/usr/share/dsv4-chat/tokenizer/tokenizer.json" assets/tokenizer/tokenizer.json
check "tokenizer LICENSE" test -s "$r/usr/share/dsv4-chat/tokenizer/LICENSE"
check "copyright" test -s "$r/usr/share/doc/dsv4-chat/copyright"
notices="$r/usr/share/doc/dsv4-chat/THIRD-PARTY-LICENSES.txt"
check "THIRD-PARTY-LICENSES lists eframe" grep -q "^eframe " "$notices"
check "THIRD-PARTY-LICENSES lists tokenizers" grep -q "^tokenizers " "$notices"

control="$(dpkg-deb --field "$deb")"
echo "$control" | grep -E '^(Version|Depends|Recommends):'
check "Depends names the GL/X11/Wayland libraries" \
    grep -qE '^Depends: libc6 \(>= [0-9.]+\).*libegl1.*libxkbcommon-x11-0' <<<"$control"
check "nvidia driver Recommended" grep -q "^Recommends:.*nvidia-driver" <<<"$control"
check "nvidia driver not a Depends" fails grep -q "^Depends:.*nvidia" <<<"$control"

mkdir "$tmp/tar"
tar -xzf "$tarball" -C "$tmp/tar"
tdir="$(find "$tmp/tar" -mindepth 1 -maxdepth 1 -type d)"
check "tarball's dsv4 is the .deb's" cmp -s "$tdir/bin/dsv4" "$r/usr/bin/dsv4"
check "tarball's dsv4-chat is the .deb's" cmp -s "$tdir/bin/dsv4-chat" "$r/usr/bin/dsv4-chat"
check "tarball has INSTALL.md and the desktop entry" \
    test -s "$tdir/INSTALL.md" -a -s "$tdir/share/applications/dsv4-chat.desktop"

echo "package-check took $((SECONDS - start)) s"
echo "package-check: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
