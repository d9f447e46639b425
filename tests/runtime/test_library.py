"""Opening kernel libraries: a library the dynamic linker refuses raises an error naming it and, for
a missing CUDA runtime, the rule the libraries follow (they bind the shared cudart)."""
import ctypes

import pytest

from mixed_gemm.runtime import library


def test_missing_cudart_names_the_library_and_the_rule(monkeypatch):
    def refuse(path):
        raise OSError("libcudart.so.13: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ctypes, "CDLL", refuse)
    with pytest.raises(library.LibraryLoadError, match=r"sm90s_x.*libcudart\.so\.13.*shared CUDA runtime"):
        library._open("sm90s_x", "/nowhere/sm90s_x.so")


def test_other_load_failures_keep_the_linker_message(tmp_path):
    bad = tmp_path / "not_a_library.so"
    bad.write_bytes(b"not an ELF file, poisoned bytes " * 4)
    with pytest.raises(library.LibraryLoadError, match="not_a_library") as err:
        library._open("not_a_library", str(bad))
    assert "CUDA runtime" not in str(err.value)
    assert isinstance(err.value, OSError)
