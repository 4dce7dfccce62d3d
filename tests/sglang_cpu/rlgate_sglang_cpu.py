"""Test infrastructure: three import-time patches that let SGLang 0.5.23 from PyPI run on
a machine without a GPU (docs/engine.md, "Real SGLang on CPU").

Installed only into the SGLang venv that scripts/sglang_cpu_venv builds (as this module
plus a ``.pth`` line that imports it at interpreter start), never into rlgate's own venv;
nothing in the product imports it, and a GPU installation of SGLang needs none of it.
Each patch acts only when it is needed and is cheap when it is not: nothing is imported
here except ``sys`` and ``importlib``, and torch is patched after its own import.

- ``sgl_kernel``: PyPI has only the CUDA build (``sglang-kernel``), whose import fails on
  ``libcuda.so.1``. A stand-in module answers every name with a function that raises
  when called; its submodules (``sgl_kernel.scalar_type``, ...) do not exist, so SGLang
  takes the fallbacks it has for their absence. None of the functions is called on CPU:
  SGLang's CPU layers use sgl_kernel's ops only with Intel AMX (``cpu_has_amx_support``
  asks for ``torch.ops.sgl_kernel.convert_weight_packed``, which the stand-in does not
  register), otherwise their torch-native paths.
- ``pin_memory``: SGLang's LoRA layers ask for pinned host buffers unconditionally
  (``torch.tensor(..., pin_memory=True)``, ``Tensor.pin_memory()``); CPU torch raises.
  Without CUDA the request is dropped (pinning only speeds up host-to-GPU copies).
- ``torchvision``: PyPI's torchvision is a CUDA build; importing it beside CPU torch fails
  registering ``torchvision::nms`` and ``torchvision::qnms`` fakes for operators its
  missing C++ library would define. The two schemas are defined before torchvision's
  first import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

_STANDIN = "sgl_kernel"


class _KernelStandIn(types.ModuleType):
    """``sgl_kernel``: every attribute is a function that raises."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        qual = f"{self.__name__}.{name}"

        def missing(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError(
                f"{qual} was called, but sgl_kernel is a stand-in on this CPU-only test "
                "machine (tests/sglang_cpu/rlgate_sglang_cpu.py)"
            )

        missing.__qualname__ = qual
        return missing


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stand-in, and runs a patch after (or before) selected imports."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == _STANDIN:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname == "torchvision":
            _define_torchvision_schemas()
        if fullname == "torch" and "torch" not in sys.modules:
            return _after(fullname, path, target, self, _patch_pin_memory)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _KernelStandIn(spec.name)
        module.__path__ = []  # a package without submodules: importing one is an ImportError
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Then(importlib.abc.Loader):
    """A loader that runs ``patch`` on the module ``real`` loaded."""

    def __init__(self, real: Any, patch: Any) -> None:
        self.real, self.patch = real, patch

    def create_module(self, spec: Any) -> Any:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.real.exec_module(module)
        self.patch(module)


def _after(fullname: str, path: Any, target: Any, finder: _Finder, patch: Any) -> Any:
    """The real spec of ``fullname``, its loader wrapped to run ``patch`` once loaded."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            continue
        spec.loader = _Then(spec.loader, patch)
        return spec
    return None


def _patch_pin_memory(torch: Any) -> None:
    if torch.cuda.is_available():
        return
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    for name in ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_strided"):
        real = getattr(torch, name)

        def unpinned(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return _real(*args, **kwargs)

        setattr(torch, name, unpinned)


_SCHEMAS_DONE = False


def _define_torchvision_schemas() -> None:
    global _SCHEMAS_DONE
    if _SCHEMAS_DONE:
        return
    _SCHEMAS_DONE = True
    import torch

    lib = torch.library.Library("torchvision", "DEF")  # noqa: F841 - kept alive below
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    sys.modules[__name__].__dict__["_torchvision_lib"] = lib


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
