"""tilefuse: a graph-level fusion compiler for deep-learning models, built on TileLang.

Public API: ``tilefuse.compile`` (torch modules, through ``torch.compile``), ``tilefuse.compile_onnx``
(ONNX files or ``ModelProto``), ``tilefuse.save``/``tilefuse.load`` (``.tfz`` artifacts), the
``tilefuse`` command line (``tilefuse.cli``).
"""

from __future__ import annotations

from tilefuse.config import VERSION as __version__  # noqa: F401
from tilefuse.api import CompiledModel, compile, compile_onnx, load, save  # noqa: F401
from tilefuse.runtime.artifact import ArtifactError  # noqa: F401
