"""The canonical kernel layout (warmup/layout.py): folders named by their content, in what Inductor hashes only.

The end-to-end proof (two installs of the same wheels, a real TRL run) is tests/e2e/test_relocated_install.py;
these hold the parts: the digests, the renaming, the patches, and the toolchain facts built from them.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from warmup import layout
from warmup.layout import Location, folder_digest, libraries_digest, rename_folders, torch_digest

TORCH_RECORD = (
    "torch/__init__.py,sha256=aaa,10\n"
    "torch/include/ATen/ATen.h,sha256=bbb,20\n"
    "torch/lib/libtorch_cpu.so,sha256=ccc,30\n"
    "torch/__pycache__/__init__.cpython-311.pyc,,\n"  # pip compiled it: listed without a hash
    "torch-2.13.0.dist-info/RECORD,,\n"
    "../../../bin/torchrun,sha256=ddd,40\n"
)


def _install_torch(site: Path, record: str = TORCH_RECORD) -> str:
    (site / "torch").mkdir(parents=True)
    info = site / "torch-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
    (info / "RECORD").write_text(record)
    return str(site / "torch")


def test_two_installs_of_the_same_torch_files_have_one_digest_and_another_file_changes_it(tmp_path):
    a = torch_digest(_install_torch(tmp_path / "a" / "site-packages"))
    b = torch_digest(_install_torch(tmp_path / "somewhere" / "else" / "site-packages"))
    compiled = torch_digest(  # pip byte-compiled this one: its RECORD lists the .pyc files, without hashes
        _install_torch(tmp_path / "c", TORCH_RECORD + "torch/__pycache__/x.cpython-311.pyc,,\n")
    )
    header = torch_digest(_install_torch(tmp_path / "d", TORCH_RECORD.replace("sha256=bbb", "sha256=eee")))
    assert a is not None and a.startswith("sha256:")
    assert a == b == compiled
    assert header != a


def test_a_torch_without_a_record_has_no_digest_and_stays_named_by_its_folder(tmp_path):
    (tmp_path / "torch").mkdir()
    assert torch_digest(str(tmp_path / "torch")) is None


def test_a_folder_digest_follows_its_files_not_its_place(tmp_path):
    for name in ("one", "two"):
        (tmp_path / name / "cpython").mkdir(parents=True)
        (tmp_path / name / "Python.h").write_text("#define PY 1\n")
        (tmp_path / name / "cpython" / "object.h").write_text("struct object;\n")
    assert folder_digest(str(tmp_path / "one")) == folder_digest(str(tmp_path / "two"))
    (tmp_path / "two" / "Python.h").write_text("#define PY 2\n")
    assert folder_digest(str(tmp_path / "one")) != folder_digest(str(tmp_path / "two"))
    assert folder_digest(str(tmp_path / "missing")) is None


def test_a_library_folder_is_named_by_the_linked_libraries_it_holds_only(tmp_path):
    (tmp_path / "libpython3.11.so").write_bytes(b"python")
    empty = libraries_digest(str(tmp_path), ["torch", "gomp"])
    (tmp_path / "libunrelated.so").write_bytes(b"x")
    assert libraries_digest(str(tmp_path), ["torch", "gomp"]) == empty
    (tmp_path / "libgomp.so.1").write_bytes(b"an OpenMP runtime")  # a conda prefix ships its own
    assert libraries_digest(str(tmp_path), ["torch", "gomp"]) != empty


def test_renaming_replaces_whole_folders_only_and_the_longest_first():
    found = (
        Location("/opt/conda/lib", "<python-lib@sha256:1>"),
        Location("/opt/conda/lib/python3.11/site-packages/torch", "<torch@sha256:2>"),
    )
    line = (
        "g++ i -I/opt/conda/lib/python3.11/site-packages/torch/include -I'/opt/conda/lib' "
        "-L/opt/conda/lib64 -L/opt/conda/lib -L/opt/conda/lib/python3.11/site-packages/torch/lib"
    )
    assert rename_folders(line, found) == (
        "g++ i -I<torch@sha256:2>/include -I'<python-lib@sha256:1>' "
        "-L/opt/conda/lib64 -L<python-lib@sha256:1> -L<torch@sha256:2>/lib"
    )
    assert rename_folders(line, ()) == line


def test_this_process_names_torch_and_python_by_content_in_the_kernel_command_line():
    import sysconfig

    import torch

    torch_folder = os.path.dirname(os.path.abspath(torch.__file__))
    paths = layout.command_line_paths()  # what the toolchain records as kernel_paths
    assert any(p.startswith("-I<torch@sha256:") and p.endswith(">/include") for p in paths), paths
    assert any(p.startswith("-L<torch@sha256:") and p.endswith(">/lib") for p in paths), paths
    assert any(p.startswith("-I<python-include@sha256:") for p in paths), paths
    assert not any(torch_folder in p or sysconfig.get_path("include") in p for p in paths), paths


def _fake_codecache() -> SimpleNamespace:
    calls: list[tuple[str, str, str]] = []

    def write(content: str, extension: str, extra: str = "", *args: object, **kwargs: object) -> tuple:
        calls.append((content, extension, extra))
        return "key", "path"

    def precompile_header(header: str, hashable_cmd_line: str, **compile_command: object) -> str:
        raise AssertionError("a training process built a precompiled header")

    return SimpleNamespace(write=write, _precompile_header=precompile_header, calls=calls)


def test_the_patch_renames_what_inductor_hashes_and_is_applied_once(monkeypatch):
    monkeypatch.setattr(layout, "locations", lambda: (Location("/venv/a/torch", "<torch@sha256:1>"),))
    codecache = _fake_codecache()
    layout.install(codecache)
    layout.install(codecache)  # a second call (activate after exec's hook) wraps nothing twice
    codecache.write("int main(){}", "main.cpp", extra="g++ -I/venv/a/torch/include")
    codecache.write("x = 1", "py")
    assert codecache.calls == [
        ("int main(){}", "main.cpp", "g++ -I<torch@sha256:1>/include"),
        ("x = 1", "py", ""),
    ]


def test_a_training_process_includes_the_kernel_header_as_text_instead_of_precompiling_it():
    codecache = _fake_codecache()
    layout.defer_precompiled_headers(codecache)
    layout.defer_precompiled_headers(codecache)
    header = codecache._precompile_header("torch/csrc/inductor/cpp_prefix.h", "g++ ...", device_type="cpu")
    assert Path(header).read_text() == "#include <torch/csrc/inductor/cpp_prefix.h>\n"
    assert not Path(header + ".gch").exists()
    assert oct(Path(header).parent.stat().st_mode & 0o777) == "0o700"  # this process's own folder


def test_the_graph_source_folders_are_where_torch_and_transformers_are_installed():
    import torch
    import transformers

    folders = layout.source_folders()
    for package in (torch, transformers):
        assert os.path.dirname(os.path.dirname(os.path.abspath(package.__file__))) in folders


def test_a_native_cpu_target_is_named_by_what_it_resolves_to_as_a_whole_flag_only():
    line = "g++ i -O3 -march=native -mavx512f -I/x/native -DNAME=-march=native_kernel '-mcpu=native'"
    tokens = {"-march=native": "<native@sha256:a>", "-mcpu=native": "<native@sha256:p>"}
    assert layout.name_native_targets(line, tokens.get) == (
        "g++ i -O3 -march=<native@sha256:a> -mavx512f -I/x/native -DNAME=-march=native_kernel "
        "'-mcpu=<native@sha256:p>'"
    )
    assert layout.name_native_targets(line, lambda flag: None) == line  # the compiler cannot say: as it is
    assert layout.native_flags(line + " -march=native") == ("-march=native", "-mcpu=native")
    assert layout.native_flags("g++ -march=x86-64-v4 -O3") == ()


def test_kernels_built_for_two_cpu_targets_get_two_keys(monkeypatch):
    """The hashed command line names what -march=native resolves to: a kernel built on a CPU of other
    extensions or tuning is not found under this machine's key (Inductor's own key holds only the literal)."""
    monkeypatch.setattr(layout, "locations", lambda: ())
    extras = []
    for target in ("<native@sha256:zen>", "<native@sha256:cascadelake>", "<native@sha256:zen>"):
        monkeypatch.setattr(layout, "_native_token", lambda flag, target=target: target)
        codecache = _fake_codecache()
        layout.install(codecache)
        codecache.write("kernel", "main.cpp", extra="g++ -O3 -march=native -mavx512f")
        extras.append(codecache.calls[0][2])
    assert extras[0] == "g++ -O3 -march=<native@sha256:zen> -mavx512f" == extras[2] != extras[1]


def test_this_machines_native_target_is_named_by_the_digest_of_its_resolution():
    from warmup import machine

    target = machine.native_target(("-march=native",))
    assert target is not None
    assert (
        layout.canonical("g++ -march=native -O3") == f"g++ -march=<native@{layout._digest(list(target))}> -O3"
    )
