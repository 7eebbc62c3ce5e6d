"""A synthetic monorepo for the big-repository figures: deterministic, shaped like a real one.

- `packages/<pkg>/{src,test,docs}/<module>/...`: packages of 40-400 files, directories nested
  two to five deep, about 20 files to a directory;
- file sizes log-normal around 1.5 KiB (most source files a few hundred bytes to a few KiB, a
  tail of generated files up to 256 KiB), text built from a vocabulary so git's delta and zlib
  see text;
- about 2% binary files (images, archives: incompressible bytes, 4-64 KiB);
- a `.gitignore` (`build/`, `node_modules/`, `*.log`) and, in the main checkout only, an
  ignored `build/` directory of outputs (a twentieth of the tracked count) that a create does
  not check out and `[create] copy = ["build/"]` would copy.

`make(path, files)` builds one repository with one commit (`gc`-packed, `gc.auto` off); copy it
with `bench.synth.copy` so each subject works on an identical repository.
"""

from __future__ import annotations

import random
from pathlib import Path

from bench import synth

TEXT_EXT = (".py", ".ts", ".tsx", ".go", ".rs", ".java", ".md", ".json", ".yaml", ".c", ".h")
BINARY_EXT = (".png", ".jpg", ".woff2", ".jar", ".wasm")
BINARY_SHARE = 0.02
IGNORED_SHARE = 20
"""One ignored build output per this many tracked files."""
GITIGNORE = "build/\nnode_modules/\n*.log\n"


def _words(rng: random.Random) -> list[str]:
    return [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 12)))
        for _ in range(2048)
    ]


def _text(rng: random.Random, words: list[str], size: int) -> bytes:
    lines: list[str] = []
    total = 0
    while total < size:
        indent = "    " * rng.randint(0, 3)
        line = indent + " ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) + "\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[:size]


def _layout(files: int, rng: random.Random) -> list[str]:
    names: list[str] = []
    pkg = 0
    while len(names) < files:
        count = min(rng.randint(40, 400), files - len(names))
        for index in range(count):
            part = rng.choices(("src", "test", "docs"), weights=(7, 2, 1))[0]
            depth = rng.randint(0, 3)
            dirs = [f"m{(index // 20) % (5 ** (level + 1))}" for level in range(depth)]
            binary = rng.random() < BINARY_SHARE
            ext = rng.choice(BINARY_EXT if binary else TEXT_EXT)
            names.append("/".join(["packages", f"p{pkg:04d}", part, *dirs, f"f{index}{ext}"]))
        pkg += 1
    return names


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def make(path: Path, files: int, seed: int = 28) -> Path:
    rng = random.Random(seed)
    words = _words(rng)
    path.mkdir(parents=True)
    synth.git(path, "init", "-q", "-b", "main")
    synth.git(path, "config", "gc.auto", "0")  # no background gc racing the measurements
    for name in _layout(files, rng):
        if name.endswith(BINARY_EXT):
            _write(path / name, rng.randbytes(rng.randint(4 << 10, 64 << 10)))
        else:
            size = min(int(rng.lognormvariate(7.3, 1.1)) + 16, 256 << 10)
            _write(path / name, _text(rng, words, size))
    (path / ".gitignore").write_text(GITIGNORE)
    synth.git(path, "add", "-A")
    synth.git(path, "commit", "-q", "-m", "synthetic monorepo")
    synth.git(path, "gc", "-q")
    build = path / "build"
    for index in range(max(1, files // IGNORED_SHARE)):
        out = build / f"o{index % 50}" / f"out{index}.o"
        _write(out, rng.randbytes(rng.randint(256, 4096)))
    (path / "build.log").write_text("ignored\n")
    return path
