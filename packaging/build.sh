#!/usr/bin/env bash
# Builds the release packages from this checkout into dist/:
#   dist/dsv4-chat_<version>_<arch>.deb             for Ubuntu 22.04+ / Debian 12+ (dpkg -i or apt install)
#   dist/dsv4-chat-<version>-linux-<arch>.tar.gz    the same files, portable, with INSTALL.md
#   dist/SHA256SUMS
# <version> is the crate version plus the commit: 0.1.0+<commits>.g<hash>[.dirty].
#
# The CUDA kernels are compiled into the binaries (DSV4_REQUIRE_FATBIN=1: no nvcc is a build error, never a
# silent NVRTC fallback); nvcc 13.0 is installed into .venv-nvcc by .ci/install-nvcc.sh when none is found.
# The .deb is assembled with dpkg-deb from a staged tree rather than cargo-deb: one staged tree feeds both
# artifacts, and nothing has to be compiled or installed beyond the workspace itself.
# Reuses target/: only the release build of the two binaries, incremental like any cargo build.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$root"
dist="$root/dist"
work="$root/target/dsv4-packaging"
umask 022

die() {
    echo "packaging: $*" >&2
    exit 1
}
need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found: $2"
}
need cargo "install Rust with rustup (see README)"
need dpkg-deb "apt-get install dpkg"
need python3 "apt-get install python3"
need objdump "apt-get install binutils"
need strip "apt-get install binutils"

# --- nvcc: the same search order as kernels/build.rs; install the pinned one only when there is none.
have_nvcc() {
    [[ -n "${DSV4_NVCC:-}" ]] || command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]] ||
        compgen -G "$root/.venv-nvcc/lib/python3*/site-packages/nvidia/cu13/bin/nvcc" >/dev/null
}
if ! have_nvcc; then
    echo "== no nvcc found: installing nvcc 13.0 into .venv-nvcc"
    bash "$root/.ci/install-nvcc.sh"
fi

# --- version: computed once here and handed to engine/build.rs, so `dsv4 --version` names exactly this tree.
commit="unknown"
count="0"
epoch="$(date +%s)"
if command -v git >/dev/null 2>&1 && [[ "$(git rev-parse --show-toplevel 2>/dev/null || true)" == "$root" ]]; then
    commit="$(git rev-parse --short HEAD)"
    count="$(git rev-list --count HEAD)"
    epoch="$(git log -1 --format=%ct HEAD)"
    if ! git diff --quiet HEAD --; then
        commit="$commit-dirty"
    fi
fi
crate_version="$(cargo metadata --no-deps --format-version 1 --locked |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "dsv4-chat"))')"
if [[ "$commit" == "unknown" ]]; then
    version="$crate_version"
else
    version="$crate_version+$count.g${commit%-dirty}"
    if [[ "$commit" == *-dirty ]]; then
        version="$version.dirty"
    fi
fi
arch="$(dpkg --print-architecture)"
echo "== dsv4-chat $version (commit $commit, $arch)"

# --- release build with the kernels precompiled.
export DSV4_GIT_COMMIT="$commit"
DSV4_REQUIRE_FATBIN=1 cargo build --release --locked -p dsv4-chat -p dsv4-engine --bins
app="$root/target/release/dsv4-chat"
cli="$root/target/release/dsv4"
"$cli" kernels --require sm_90a,sm_120a,compute_90 >/dev/null ||
    die "the release dsv4 lacks precompiled kernels (see 'target/release/dsv4 kernels')"

# --- runtime dependencies. The binaries link only glibc/libgcc; the GL/X11/Wayland libraries are dlopen()ed
# by winit/glutin, so they are found by the sonames in the binary's strings (release builds pack string
# literals back to back, hence no anchors, and the length cap keeps a match from spanning a run of symbol
# names). Each must map to a package here: a new one fails the build instead of shipping an undeclared
# dependency.
unknown_needed="$(objdump -p "$app" "$cli" | awk '/NEEDED/ {print $2}' | sort -u |
    grep -vE '^(libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|ld-linux-x86-64\.so\.2|libpthread\.so\.0|libdl\.so\.2)$' || true)"
[[ -z "$unknown_needed" ]] || die "unexpected linked libraries, declare them: $unknown_needed"
glibc="$(objdump -T "$app" "$cli" | grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sed 's/GLIBC_//' | sort -uV | tail -n 1)"
depends="libc6 (>= $glibc), libgcc-s1"
recommends=""
add_dep() {
    case ", $depends, " in *", $1, "*) ;; *) depends="$depends, $1" ;; esac
}
add_rec() {
    case ", $recommends, " in *", $1, "*) ;; *) recommends="${recommends:+$recommends, }$1" ;; esac
}
while read -r soname; do
    case "$soname" in
    libEGL.so*) add_dep libegl1 ;;
    libGL.so*) add_rec libgl1 ;; # GLX fallback on X11 only; EGL is tried first
    libX11.so*) add_dep libx11-6 ;;
    libX11-xcb.so*) add_dep libx11-xcb1 ;;
    libxcb.so*) add_dep libxcb1 ;;
    libXcursor.so*) add_dep libxcursor1 ;;
    libXi.so*) add_dep libxi6 ;;
    libXrender.so*) add_dep libxrender1 ;;
    libXrandr.so*) add_dep libxrandr2 ;;
    libxkbcommon.so*) add_dep libxkbcommon0 ;;
    libxkbcommon-x11.so*) add_dep libxkbcommon-x11-0 ;;
    libwayland-client.so*) add_dep libwayland-client0 ;;
    libwayland-egl.so*) add_dep libwayland-egl1 ;;
    libwayland-cursor.so*) add_dep libwayland-cursor0 ;;
    # The GPU path; without a driver the app falls back to the CPU demo model, so only recommended.
    # Debian: nvidia-driver; Ubuntu: nvidia-driver-NNN, whose libnvidia-compute-NNN provides libcuda1.
    libcuda.so*) add_rec "nvidia-driver | libcuda1" ;;
    # cudarc's dynamic loader names every CUDA library it can open; only those the kernels crate uses are
    # ever loaded, and they come with the driver (libcuda) or are not used by the shipped code paths.
    libnvrtc* | libcublas* | libnccl* | libcurand* | libcudnn* | libcufft* | libcusparse* | \
        libcusolver* | libnvToolsExt* | libcupti* | libnvJitLink* | libcufile* | libnvidia-ml* | libcudart*) ;;
    libc.so.6 | libm.so.6 | libgcc_s.so.1 | ld-linux-x86-64.so.2 | libpthread.so.0 | libdl.so.2) ;;
    *) die "the binaries name $soname: map it to its package in packaging/build.sh" ;;
    esac
done < <(strings -n 6 "$app" "$cli" | grep -oE 'lib[A-Za-z0-9_+-]{1,40}\.so(\.[0-9]+)*' | sort -u)
add_rec "nvidia-driver | libcuda1"

# --- staged tree: /usr layout, shared by the .deb and the tarball.
rm -rf "$work"
stage="$work/deb"
doc="$stage/usr/share/doc/dsv4-chat"
install -Dm755 "$app" "$stage/usr/bin/dsv4-chat"
install -Dm755 "$cli" "$stage/usr/bin/dsv4"
# Symbols only; the release profile has no debug info. Halves the size of what users download.
strip --strip-unneeded "$stage/usr/bin/dsv4-chat" "$stage/usr/bin/dsv4"
install -Dm644 packaging/dsv4-chat.desktop "$stage/usr/share/applications/dsv4-chat.desktop"
for size in 16 32 48 64 128 256; do
    install -Dm644 "assets/icons/dsv4-chat-$size.png" \
        "$stage/usr/share/icons/hicolor/${size}x${size}/apps/dsv4-chat.png"
done
install -Dm644 assets/icons/dsv4-chat.svg "$stage/usr/share/icons/hicolor/scalable/apps/dsv4-chat.svg"
for f in tokenizer.json LICENSE README.md; do
    install -Dm644 "assets/tokenizer/$f" "$stage/usr/share/dsv4-chat/tokenizer/$f"
done
install -Dm644 packaging/copyright "$doc/copyright"
install -Dm644 README.md "$doc/README.md"
install -Dm644 assets/tokenizer/LICENSE "$doc/LICENSE.tokenizer"
python3 packaging/third-party.py "$doc/THIRD-PARTY-LICENSES.txt"

# --- .deb
mkdir -p "$stage/DEBIAN"
installed_kb="$(du -sk --apparent-size "$stage/usr" | cut -f1)"
cat >"$stage/DEBIAN/control" <<EOF
Package: dsv4-chat
Version: $version
Architecture: $arch
Maintainer: dsv4-chat developers <dsv4-chat@localhost>
Installed-Size: $installed_kb
Depends: $depends
Recommends: $recommends
Section: utils
Priority: optional
Description: desktop chat app for DeepSeek-V4-Flash on local NVIDIA GPUs
 dsv4-chat runs DeepSeek-V4-Flash from the official checkpoint format on your
 own NVIDIA GPUs (Hopper sm_90a, Blackwell sm_120a; CUDA kernels precompiled),
 with a native desktop chat window. Without a GPU or a downloaded model it
 opens with a small built-in demo model whose replies are noise.
 .
 Also installs dsv4, the command-line tool (chat, generate, logits, kernels).
EOF
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 644 "$stage/DEBIAN/control" "$stage/DEBIAN/md5sums"
# Fixed timestamps (the commit's): rebuilding the same commit gives the same archives.
find "$stage" -exec touch -h -d "@$epoch" {} +

mkdir -p "$dist"
rm -f "$dist"/dsv4-chat_*.deb "$dist"/dsv4-chat-*.tar.gz "$dist/SHA256SUMS"
deb="$dist/dsv4-chat_${version}_${arch}.deb"
SOURCE_DATE_EPOCH="$epoch" dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null

# --- tarball: bin/ and share/ of the same tree, plus INSTALL.md.
name="dsv4-chat-$version-linux-$(uname -m)"
tree="$work/tar/$name"
mkdir -p "$tree"
# Hard links: the same files, without a second copy on disk.
cp -al "$stage/usr/bin" "$stage/usr/share" "$tree/"
install -m644 packaging/INSTALL.md "$tree/INSTALL.md"
touch -h -d "@$epoch" "$tree" "$tree/INSTALL.md"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$work/tar" -cf - "$name" |
    gzip -n -9 >"$dist/$name.tar.gz"

(cd "$dist" && sha256sum "$(basename "$deb")" "$name.tar.gz" >SHA256SUMS)
echo "== built"
ls -l "$deb" "$dist/$name.tar.gz"
