#!/usr/bin/env bash
# Smoke test and screenshot of the RELEASE app on the built-in demo model, under Xvfb.
#
#   scripts/screenshot.sh [OUTPUT.png]      (default: app/docs/screenshot.png)
#
# Builds `dsv4-chat` in release (reusing target/), starts it on a virtual display with a temp
# data dir, starts a conversation (Ctrl+N focuses the composer), types a message with xdotool,
# waits until the saved conversation holds a finished reply, and captures the window. Fails when
# the window never appears, the capture is blank (too few distinct colours), no reply arrives,
# or the app has died by then. Installs the apt packages it needs when missing (CI runs as root
# on Debian 12). No GPU: the app draws through Mesa's software OpenGL.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
out=${1:-app/docs/screenshot.png}
case $out in /*) ;; *) out="$repo/$out" ;; esac

# Seconds to wait for the window, and for the reply (a cold demo-model write included).
window_timeout=60
reply_timeout=240
# A real frame has text, widgets, shading: hundreds of colours. A blank or black one has one.
min_colours=16

say() { echo "== screenshot: $*"; }
die() {
    echo "screenshot: FAIL: $*" >&2
    if [[ -n ${tmp:-} && -f $tmp/app.log ]]; then
        echo "---- app log (last 40 lines)" >&2
        tail -n 40 "$tmp/app.log" >&2 || true
    fi
    exit 1
}

install_missing() {
    local missing=()
    command -v Xvfb >/dev/null 2>&1 || missing+=(xvfb xauth)
    command -v xdotool >/dev/null 2>&1 || missing+=(xdotool)
    command -v import >/dev/null 2>&1 || missing+=(imagemagick)
    command -v xwininfo >/dev/null 2>&1 || missing+=(x11-apps)
    # The OpenGL/X11 libraries the app loads at run time (software rendering under Xvfb).
    local lib pkg pair known
    known=$(ldconfig -p 2>/dev/null || true)
    for pair in libGL.so.1:libgl1 libGLX_mesa.so.0:libglx-mesa0 swrast_dri.so:libgl1-mesa-dri \
        libxkbcommon-x11.so.0:libxkbcommon-x11-0 libXcursor.so.1:libxcursor1 libXi.so.6:libxi6 \
        libX11-xcb.so.1:libx11-xcb1; do
        lib=${pair%%:*}
        pkg=${pair##*:}
        if [[ $known != *"$lib"* && -z $(find /usr/lib -name "$lib" -print -quit 2>/dev/null) ]]; then
            missing+=("$pkg")
        fi
    done
    # Demo replies are random tokens, many of them Chinese; users' desktops have a CJK font the
    # app falls back to (app/src/fonts.rs), so give the picture one too instead of boxes.
    if [[ ! -f /usr/share/fonts/truetype/wqy/wqy-microhei.ttc &&
        ! -f /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc ]]; then
        missing+=(fonts-wqy-microhei)
    fi
    [[ ${#missing[@]} -eq 0 ]] && return 0
    say "installing ${missing[*]} (apt-get)"
    local sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# Only the processes this script started are stopped, by their ids.
app_pid=""
xvfb_pid=""
tmp=""
cleanup() {
    if [[ -n $app_pid ]]; then kill "$app_pid" 2>/dev/null || true; fi
    if [[ -n $xvfb_pid ]]; then kill "$xvfb_pid" 2>/dev/null || true; fi
    if [[ -n $tmp ]]; then rm -rf "$tmp"; fi
}
trap cleanup EXIT

colours() { identify -format '%k' "$1" 2>/dev/null || echo 0; }

install_missing

say "cargo build --release -p dsv4-chat"
cargo build --release -p dsv4-chat
bin=${CARGO_TARGET_DIR:-$repo/target}/release/dsv4-chat
[[ -x $bin ]] || die "no binary at $bin"

tmp=$(mktemp -d)
mkdir -p "$tmp/data"
# Short replies keep the picture tidy and the smoke test quick.
echo '{"sampling": {"max_tokens": 160}}' >"$tmp/data/settings.json"

# Xvfb picks a free display number and writes it to fd 3.
Xvfb -displayfd 3 -screen 0 1280x800x24 -nolisten tcp 3>"$tmp/display" 2>"$tmp/xvfb.log" &
xvfb_pid=$!
for _ in $(seq 100); do
    [[ -s $tmp/display ]] && break
    sleep 0.1
done
[[ -s $tmp/display ]] || die "Xvfb did not start: $(cat "$tmp/xvfb.log")"
DISPLAY=":$(head -n1 "$tmp/display")"
export DISPLAY
say "Xvfb on $DISPLAY"

# The demo model is cached under DSV4_CACHE_DIR; keep the caller's cache if it set one.
DSV4_CHAT_DATA_DIR="$tmp/data" DSV4_CACHE_DIR="${DSV4_CACHE_DIR:-$tmp/cache}" \
    "$bin" >"$tmp/app.log" 2>&1 &
app_pid=$!

say "waiting for the window"
window=$(timeout "$window_timeout" xdotool search --sync --onlyvisible --name '^dsv4-chat$' |
    head -n1) || true
[[ -n $window ]] || die "no window within ${window_timeout}s"
# Mapped is not drawn: wait until the window shows a real frame.
for _ in $(seq "$window_timeout"); do
    import -window "$window" "$tmp/first.png" 2>/dev/null || true
    [[ -f $tmp/first.png && $(colours "$tmp/first.png") -ge $min_colours ]] && break
    sleep 1
done
[[ $(colours "$tmp/first.png") -ge $min_colours ]] || die "the window stays blank"

say "sending a message"
# No window manager under Xvfb: focus the window explicitly before sending keys.
xdotool windowfocus --sync "$window"
xdotool key --window "$window" ctrl+n
sleep 0.5
xdotool type --delay 40 "Hello from the screenshot script! What can you do?"
xdotool key Return

say "waiting for the reply"
reply_done() {
    # A finished reply is saved with its stats; the conversation file appears on send.
    grep -qs '"stats"' "$tmp"/data/conversations/*.json
}
waited=0
until reply_done; do
    kill -0 "$app_pid" 2>/dev/null || die "the app exited while replying"
    ((waited < reply_timeout)) || die "no finished reply within ${reply_timeout}s"
    sleep 1
    waited=$((waited + 1))
done
# Let the last frame (stats line) draw.
sleep 1

kill -0 "$app_pid" 2>/dev/null || die "the app is not running after the reply"
mkdir -p "$(dirname "$out")"
import -window "$window" -strip "$tmp/shot.png"
n=$(colours "$tmp/shot.png")
((n >= min_colours)) || die "the screenshot is blank ($n colours)"
kill -0 "$app_pid" 2>/dev/null || die "the app died while being captured"
cp "$tmp/shot.png" "$out"
say "ok: $out ($n colours, $(stat -c %s "$out") bytes); the app was still running"
