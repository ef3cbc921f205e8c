"""The tagged-object format for values JSON lacks, and the class lookup that never imports.

A value JSON has no type for is a one-key object ``{"__<tag>__": data}``. A
user dict that could be read as one (a single ``__dunder__`` key), or whose
keys are not all strings, is stored as ``{"__dict__": [[key, value], ...]}``,
so every dict comes back as it was. Classes are looked up, never imported,
and only Item subclasses and dataclasses are ever built.
"""

from __future__ import annotations

import inspect
import pathlib
import sys
from typing import Any

_BYTES, _TUPLE, _DICT, _SET, _FROZENSET = "__bytes__", "__tuple__", "__dict__", "__set__", "__frozenset__"
_DATETIME, _DATE, _TIME, _TIMEDELTA, _DECIMAL = "__datetime__", "__date__", "__time__", "__timedelta__", "__decimal__"
_ITEM, _DATACLASS = "__item__", "__dataclass__"
_ODICT, _UUID, _PATH = "__odict__", "__uuid__", "__path__"
#: pathlib classes by name (a fixed table: no class is looked up from stored data)
_PATHS = {
    cls.__name__: cls
    for cls in (pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath, pathlib.WindowsPath)
}


def _find_class(path: Any) -> Any:
    """The object at *path* in an already imported module (never imports: that would run code)."""
    if not isinstance(path, str):
        return None
    module, obj = None, None
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest loaded module prefix
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj = module
            for name in parts[i:]:
                obj = inspect.getattr_static(obj, name, None)  # no properties or __getattr__ run
            return obj
    return None
