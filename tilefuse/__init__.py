"""tilefuse: a graph-level fusion compiler for deep-learning models, built on TileLang.

Public API: ``tilefuse.compile`` (torch modules, through ``torch.compile``), ``tilefuse.compile_onnx``
(ONNX files or ``ModelProto``), ``tilefuse.save``/``tilefuse.load`` (``.tfz`` artifacts), the
``tilefuse`` command line (``tilefuse.cli``).
"""

from __future__ import annotations

import os as _os

# Note: the sub-packages frontends/, lowering/, runtime/ and models/ sit beside tilefuse/ in the
# source tree and are mapped into this package by setuptools' package-dir when installed. When
# Python imports this package straight from a source checkout (a script run from the repository
# root puts it first on sys.path), extend __path__ so that those folders resolve the same way.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "frontends")):
    __path__.append(_root)  # type: ignore[name-defined]

__version__ = "0.1.0"

from tilefuse.api import CompiledModel, compile, compile_onnx, load, save  # noqa: F401
from tilefuse.runtime.artifact import ArtifactError  # noqa: F401
