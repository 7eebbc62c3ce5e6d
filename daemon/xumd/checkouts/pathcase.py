"""Whether two spellings name one directory, asked of the filesystem, never of the strings.

macOS volumes are case-insensitive by default (so are NTFS, and ext4 directories with casefold):
`~/Src/Repo` and `~/src/repo` are one repository, and a workspace `Fix` next to `fix` is one
directory. `os.path.realpath` keeps the case it was given, so two realpaths may differ and still
name one directory. What holds here:

- `canonical(path)`: the realpath with every existing component in the spelling its directory
  stores. A component is looked up in another case only when the filesystem says that spelling
  is the same entry (one lstat of the case-swapped name, same st_dev and st_ino), so a
  case-sensitive filesystem costs one failed lstat per component and is never listed.
- `case_insensitive(directory)`: whether names in the directory (or, while it does not exist,
  its nearest existing ancestor, whose rule a new directory inherits) are told apart by case:
  `pathconf(_PC_CASE_SENSITIVE)` where the system has it (macOS), else a probe: make a hidden
  directory there, lstat its case-swapped name, remove it. Cached per directory identity. A
  directory where no probe can be made counts as case-insensitive: the stricter answer refuses a
  name, never deletes through an alias.
- `fold(name)`: the comparison key of names in a case-insensitive directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PROBE_PREFIX = ".xum-case-"
_CACHE_MAX = 1024
_probed: dict[tuple[int, int], bool] = {}


def fold(name: str) -> str:
    return name.casefold()


def _swapped(name: str) -> str:
    return name.swapcase()


def _same_entry(directory: str, name: str, st: os.stat_result) -> bool:
    """Whether `name` in another case is this very entry of `directory`."""
    other = _swapped(name)
    if other == name:
        return False  # no letter that has a case: no other spelling to ask about
    try:
        seen = os.lstat(os.path.join(directory, other))
    except OSError:
        return False
    return (seen.st_dev, seen.st_ino) == (st.st_dev, st.st_ino)


def _stored_name(directory: str, name: str, st: os.stat_result) -> str:
    """The spelling `directory` stores for the entry that `name` reaches."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return name
    if name in entries:
        return name
    folded = fold(name)
    for entry in entries:
        if fold(entry) != folded:
            continue
        try:
            seen = os.lstat(os.path.join(directory, entry))
        except OSError:
            continue
        if (seen.st_dev, seen.st_ino) == (st.st_dev, st.st_ino):
            return entry
    return name


def canonical(path: Path | str) -> Path:
    """The realpath of `path`, each existing component spelled as stored; components that do
    not exist (yet) are kept as given."""
    parts = Path(os.path.realpath(path)).parts
    current = parts[0]
    for i, given in enumerate(parts[1:], start=1):
        try:
            st = os.lstat(os.path.join(current, given))
        except OSError:
            return Path(current).joinpath(*parts[i:])
        stored = _stored_name(current, given, st) if _same_entry(current, given, st) else given
        current = os.path.join(current, stored)
    return Path(current)


def _existing(directory: Path) -> Path:
    while not directory.is_dir() and directory.parent != directory:
        directory = directory.parent
    return directory


def case_insensitive(directory: Path | str) -> bool:
    """Whether the filesystem of `directory` treats names differing only in case as one."""
    anchor = _existing(Path(os.path.realpath(directory)))
    try:
        st = os.stat(anchor)
    except OSError:
        return True
    key = (st.st_dev, st.st_ino)
    known = _probed.get(key)
    if known is None:
        known = _probe(anchor)
        if len(_probed) >= _CACHE_MAX:
            _probed.clear()
        _probed[key] = known
    return known


def _probe(directory: Path) -> bool:
    if "PC_CASE_SENSITIVE" in os.pathconf_names:
        try:
            return os.pathconf(directory, "PC_CASE_SENSITIVE") == 0
        except OSError:
            pass  # not answered for this filesystem: probe
    try:
        made = tempfile.mkdtemp(prefix=PROBE_PREFIX, dir=directory)
    except OSError:
        return True
    try:
        name = os.path.basename(made)
        return _same_entry(str(directory), name, os.lstat(made))
    finally:
        os.rmdir(made)
