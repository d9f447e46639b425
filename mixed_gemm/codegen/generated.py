"""``generated/``: the rendered sources of the default catalogs, checked into the repository so
it always shows what the templates produce (a test re-renders them and fails on any difference)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Tuple


def write_generated(directory: Path, items: Iterable[Tuple[str, str]]) -> List[Path]:
    """Write ``<name>.cu`` for each ``(name, source)`` into ``directory``, touching only files whose
    text changed, and remove stale ``mg_*.cu`` files no item produces. Returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    wanted = {f"{name}.cu": text for name, text in items}
    written = []
    for fname, text in wanted.items():
        path = directory / fname
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    for stale in directory.glob("mg_*.cu"):
        if stale.name not in wanted:
            stale.unlink()
    return written
