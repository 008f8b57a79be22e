#!/usr/bin/env python3
"""Writes THIRD-PARTY-LICENSES.txt: every Rust crate linked into dsv4-chat and dsv4, its licence, and the
licence texts the crates ship (each distinct text once, with the crates that use it).

Reads `cargo metadata` (the locked dependency graph, Linux x86-64 only) and each crate's own LICENSE/COPYING
files from the cargo registry, so nothing beyond cargo and Python is needed.
Usage: third-party.py OUT_FILE
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

# The crates whose binaries we ship; everything reachable from them through normal dependencies is linked in.
ROOTS = ("dsv4-chat", "dsv4-engine")
TARGET = "x86_64-unknown-linux-gnu"
LICENSE_PREFIXES = ("license", "licence", "copying", "notice", "copyright", "unlicense")


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", TARGET],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def shipped_packages(meta):
    """Packages reachable from ROOTS through normal (not dev, not build) dependency edges."""
    by_id = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    roots = [p["id"] for p in meta["packages"] if p["name"] in ROOTS and p["source"] is None]
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            if any(k["kind"] is None for k in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    # Our own workspace crates are covered by the project's licence, not listed as third party.
    return sorted((by_id[i] for i in seen if by_id[i]["source"] is not None), key=lambda p: (p["name"], p["version"]))


def is_licence(f):
    name = f.name.lower()
    return name.startswith(LICENSE_PREFIXES) or "license" in name or "licence" in name


def licence_files(pkg):
    root = Path(pkg["manifest_path"]).parent
    files = {f for f in root.iterdir() if f.is_file() and is_licence(f)}
    # Bundled fonts (egui's default fonts) carry their own licences, OFL.txt, UFL.txt and one .txt per font,
    # which must ship with the binaries that embed them.
    fonts = root / "fonts"
    if fonts.is_dir():
        files |= {f for f in fonts.iterdir() if f.is_file() and (is_licence(f) or f.suffix == ".txt")}
    if pkg.get("license_file"):
        extra = root / pkg["license_file"]
        if extra.is_file():
            files.add(extra)
    return sorted(files)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: third-party.py OUT_FILE")
    pkgs = shipped_packages(metadata())
    texts = {}  # sha256 of the normalised text -> (text, [crate names])
    rows, without = [], []
    for p in pkgs:
        name = f'{p["name"]} {p["version"]}'
        rows.append(f'{name:<44} {p.get("license") or "see licence file":<36} {p.get("repository") or ""}')
        files = licence_files(p)
        if not files:
            authors = ", ".join(p.get("authors") or []) or "authors not listed"
            without.append(f"{name}: {p.get('license') or '?'}; copyright {authors}")
        for f in files:
            text = f.read_text(encoding="utf-8", errors="replace").strip()
            # Whitespace-only differences (line wrapping, trailing spaces) are the same licence text.
            key = hashlib.sha256(" ".join(text.split()).encode()).hexdigest()
            label = f.relative_to(Path(p["manifest_path"]).parent)
            texts.setdefault(key, (text, []))[1].append(f"{name} ({label})")

    out = [
        "Third-party software in dsv4-chat and dsv4",
        "==========================================",
        "",
        "The binaries statically link the Rust crates below (Linux x86-64 build). dsv4-chat itself is MIT",
        "licensed. The DeepSeek-V4 tokenizer (tokenizer.json, MIT) is listed in its own LICENSE next to it.",
        "",
        f"{len(pkgs)} crates: name version, licence (SPDX), repository",
        "",
        *rows,
        "",
    ]
    if without:
        out += [
            "These crates ship no licence file in their package; their terms are the standard texts of the SPDX",
            "licences named (each text is reproduced below for other crates), with these copyright holders:",
            *("  " + n for n in without),
            "",
        ]
    out += ["Licence texts shipped by the crates", "===================================", ""]
    for text, users in sorted(texts.values(), key=lambda t: t[1][0]):
        out += ["-" * 78, "Used by: " + ", ".join(users), "-" * 78, text, ""]
    Path(sys.argv[1]).write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"{sys.argv[1]}: {len(pkgs)} crates, {len(texts)} distinct licence texts")


if __name__ == "__main__":
    main()
