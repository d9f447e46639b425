"""The product never speaks of its work rounds: no history markers (a numbered round of work, an
issue number, a numbered turn) in any tracked file's text or name. History belongs in git.

Reads every file git tracks (text files only: binary ones and compressed or image formats are
skipped); skips where the tree is not a git checkout."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Each pattern and what it stands for (in failure messages). Bounded by letters, not word
# boundaries, so that names like ``h100-<round>17.csv`` or ``x_<round>18_a.sh`` are caught too.
MARKERS = (
    (re.compile(r"(?<![a-z])ses" r"sions?(?![a-z])", re.IGNORECASE), "a work round"),
    # an issue number after "issue" and a "#" or a "_"/"-", or in parentheses; not the verb "issue".
    (re.compile(r"(?<![a-z])issues?(?:[ _-]?#|[_-])\d+|\(#\d+\)", re.IGNORECASE), "an issue number"),
    (re.compile(r"(?<![a-z])turn[ _-]?\d+", re.IGNORECASE), "a numbered turn"),
)
BINARY_SUFFIXES = (".gz", ".png", ".jpg", ".jpeg", ".gif", ".pdf", ".whl", ".zip", ".tar", ".so", ".o",
                   ".cubin", ".fatbin", ".pt", ".safetensors", ".gguf", ".npy", ".npz")
SHOWN = 200  # failure lines listed (the count says how many more)


def _tracked() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files are unknown")
    proc = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {proc.stderr.decode(errors='replace').strip()}")
    return [name for name in proc.stdout.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary (or vanished) file."""
    if path.name.endswith(BINARY_SUFFIXES) or not path.is_file():
        return None
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def find_markers(names, root: Path = REPO) -> list[str]:
    """``name:line: text (what)`` for every marker in the files ``names`` (paths relative to
    ``root``), and ``name: file name (what)`` for a marker in a name."""
    found = []
    for name in names:
        for pattern, what in MARKERS:
            if pattern.search(name):
                found.append(f"{name}: file name ({what})")
        text = _text(root / name)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for pattern, what in MARKERS:
                if pattern.search(line):
                    found.append(f"{name}:{number}: {line.strip()[:160]} ({what})")
    return found


def test_no_history_markers_in_tracked_files():
    found = find_markers(_tracked())
    more = f"\n... and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    assert not found, (f"{len(found)} history markers (say what the code does, cite docs/notes/<topic>.md; "
                       "history belongs in git):\n" + "\n".join(found[:SHOWN]) + more)


def test_the_check_finds_markers(tmp_path):
    # The markers are spelled apart so that this file passes its own check.
    word, issue, turn = "ses" + "sion", "Issue" + " #7", "turn" + " 3"
    (tmp_path / "a.py").write_text(f"x = 1\n# measured in {word} 12\n# see {issue} and {turn}\n# fixed (#{8})\n")
    (tmp_path / "b.md").write_text(f"{word}al and issues are fine; so are return 5 and #8.\n")
    (tmp_path / "c.gz").write_bytes(f"{word}\n".encode())
    (tmp_path / "d.bin").write_bytes(f"\0{word}\n".encode())
    found = find_markers(["a.py", "b.md", "c.gz", "d.bin"], tmp_path)
    assert [f.split(": ")[0] + " " + f.rsplit("(", 1)[1] for f in found] == [
        "a.py:2 a work round)", "a.py:3 an issue number)", "a.py:3 a numbered turn)", "a.py:4 an issue number)"]
    for name in (f"h100-{word}17-m16.csv.gz", f"bench/{word}18_a.sh", f"x_e2e_{word}s.md", "turn" + "_3.txt"):
        assert find_markers([name], tmp_path) == [f"{name}: file name ({'a numbered turn' if 'turn' in name else 'a work round'})"]
