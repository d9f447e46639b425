"""The project headers a kernel source includes, found without a toolchain.

A cache key must change when a header the source includes changes, and only then: keying on whole
template folders re-keyed every kernel whenever any shared header was touched. nvcc -M answers
exactly, but needs nvcc and the CUTLASS headers, and a deployment machine loading a kernel package
has neither. Our templates include each other with plain ``#include "dir/file.cuh"`` lines
(quoted, relative to ``templates/``, as the ``-I`` path nvcc gets), so a scan of those lines gives
the same set; tests/compile/test_deps.py checks it against ``nvcc -M`` for every family. A line
inside ``#if`` counts whether or not the branch is taken: at worst a key changes needlessly.
Headers outside ``templates/`` (CUTLASS, CUDA) enter through the toolchain recorded with a build.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

from .. import _paths

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def _includes(text: str) -> List[str]:
    return _INCLUDE.findall(text)


def template_deps(source: str) -> List[Tuple[str, Path]]:
    """``(path relative to templates/, path)`` of every file under ``templates/`` that ``source``
    includes, directly or through another, sorted. A quoted include resolves against the
    including file's folder first, then ``templates/`` (nvcc's order for ``-I templates``); names
    found in neither (CUTLASS's, which also use quotes) are not ours and are skipped."""
    root = _paths.templates_dir().resolve()
    found = {}
    todo = [(name, None) for name in _includes(source)]
    while todo:
        name, parent = todo.pop()
        for base in ((parent,) if parent is not None else ()) + (root,):
            path = (base / name).resolve()
            if path.is_file() and root in path.parents:
                rel = path.relative_to(root).as_posix()
                if rel not in found:
                    found[rel] = path
                    todo.extend((inc, path.parent) for inc in _includes(path.read_text()))
                break
    return sorted(found.items())
