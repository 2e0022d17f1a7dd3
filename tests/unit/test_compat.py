"""The seams to other libraries' private names (warmup/_compat/): every target holds at the installed versions,
a moved one is named with the seam function that needs it, and no other product module reaches a private name
of torch, TRL, accelerate or transformers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from warmup._compat import accelerate, kernels, targets, torch, transformers, trl
from warmup._compat.targets import Target
from warmup.errors import IncompatibleLibraryError

SEAMS = [torch, trl, accelerate, transformers, kernels]
PRODUCT = [Path(__file__).resolve().parents[2] / folder for folder in ("warmup", "api", "worker")]
LIBRARIES = ("torch", "trl", "accelerate", "transformers")
# Classes of theirs whose private attributes a module might reach by name.
THEIR_CLASSES = {"AcceleratorState", "PartialState", "Trainer", "OptimizedModule"}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _private(dotted: str) -> bool:
    top, *rest = dotted.split(".")
    if top in LIBRARIES or top in THEIR_CLASSES:
        return any(part.startswith("_") and not part.startswith("__") for part in rest) or (
            top in THEIR_CLASSES and "__init__" in rest
        )
    return dotted == "sys._getframe"


def reaches_private_names(source: str) -> list[str]:
    """The private names of the four libraries a module's code reaches (imports and attribute chains; its
    strings and comments are not code)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [name for name in names if _private(name)]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _private(alias.name)]
        elif isinstance(node, ast.Attribute) and (dotted := _dotted(node)) and _private(dotted):
            found.append(dotted)
        elif isinstance(node, ast.Assign):  # a patch: `SomeClass.__init__ = ...`
            found += [
                dotted
                for target in node.targets
                if isinstance(target, ast.Attribute)
                and target.attr == "__init__"
                and (dotted := _dotted(target))
            ]
    return found


@pytest.mark.parametrize("seam", SEAMS, ids=lambda seam: seam.LIBRARY)
def test_every_target_of_a_seam_holds_at_the_installed_version(seam):
    assert seam.check() == []


def test_a_moved_target_is_named_with_the_seam_function_that_needs_it():
    gone = Target("torch._inductor.codecache", "no_such_name", "wrap_kernel_write")
    with pytest.raises(
        IncompatibleLibraryError, match=r"torch \S+: torch\._inductor\.codecache\.no_such_name is gone"
    ):
        targets.resolve("torch", ("2.13.0",), gone)
    assert (
        "wrap_kernel_write needs it (checked on torch 2.13.0)"
        in targets.check("torch", ("2.13.0",), (gone,))[0]
    )


def test_a_changed_signature_is_named_with_the_parameters_it_takes_now():
    changed = Target("torch._inductor.codecache", "write", "wrap_kernel_write", ("content", "suffix"))
    (problem,) = targets.check("torch", ("2.13.0",), (changed,))
    assert "takes (content, extension, extra" in problem and "not (content, suffix, ...)" in problem


def test_no_other_product_module_reaches_a_private_name_of_the_ml_stack():
    reaching = set()
    for folder in PRODUCT:
        for path in folder.rglob("*.py"):
            relative = path.relative_to(PRODUCT[0].parent).as_posix()
            if relative.startswith(("warmup/_compat/", "migrations/")) or "/migrations/" in relative:
                continue
            if reaches_private_names(path.read_text()):
                reaching.add(relative)
    assert reaching == set()


def test_the_check_sees_imports_and_attribute_chains_but_not_strings():
    code = (
        "import torch._dynamo\nfrom trl.data_utils import _pack_bfd\nfrom torch._inductor import config\n"
        "x = accelerate.state.PartialState._shared_state\ntrainer.__init__ = f\n"
        "message = 'set torch._dynamo.config.recompile_limit'\n"
    )
    assert sorted(reaches_private_names(code)) == [
        "accelerate.state.PartialState._shared_state",
        "torch._dynamo",
        "torch._inductor.config",
        "trainer.__init__",
        "trl.data_utils._pack_bfd",
    ]


class _Layer:
    """A layer as transformers' `use_kernelized_func` leaves it: its own instances of function modules."""

    def __init__(self, *functions: object) -> None:
        self._kernel_funcs = {f"f{i}": function for i, function in enumerate(functions)}

    def modules(self) -> list[_Layer]:
        return [self]


def _function_module(pickles_by_name: bool) -> object:
    class Func:  # defined in a local scope, as kernels defines it
        if pickles_by_name:

            def __reduce__(self) -> str:
                return "apply_rotary_pos_emb"

    return Func()


def test_hub_kernel_function_classes_get_their_own_name_so_torch_pickles_them(monkeypatch):
    monkeypatch.setattr(kernels, "TARGETS", ())  # the targets themselves: the check above
    function = _function_module(pickles_by_name=True)
    assert "<locals>" in type(function).__qualname__
    assert kernels.saveable_kernel_functions(_Layer(function, function)) == 1
    assert type(function).__qualname__ == type(function).__name__ == "Func"
    assert kernels.saveable_kernel_functions(_Layer(function)) == 0  # once


def test_a_hub_kernel_function_class_that_does_not_pickle_by_name_is_named_not_renamed(monkeypatch):
    monkeypatch.setattr(kernels, "TARGETS", ())
    function = _function_module(pickles_by_name=False)
    with pytest.raises(IncompatibleLibraryError, match="does not pickle itself by name"):
        kernels.saveable_kernel_functions(_Layer(function))
    assert "<locals>" in type(function).__qualname__
