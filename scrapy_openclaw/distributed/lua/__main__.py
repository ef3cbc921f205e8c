"""Write ``_embedded.py`` from the ``.lua`` files (``--check``: exit 1 if it is out of date).

``python -m scrapy_openclaw.distributed.lua`` after changing a script; a test
fails while the embedded copy differs from the files.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

EMBEDDED = Path(__file__).with_name("_embedded.py")
HEADER = '''"""The Lua scripts as Python text (generated: ``python -m scrapy_openclaw.distributed.lua``; do not edit).

The fallback for a copy of the package whose ``.lua`` files did not travel:
one vendored into a project's egg by a ``setup.py`` without package data.
"""

SCRIPTS = {
'''


def render() -> str:
    """The text ``_embedded.py`` must have: every ``.lua`` file of the package, by name."""
    files = sorted(
        (f for f in resources.files("scrapy_openclaw.distributed.lua").iterdir() if f.name.endswith(".lua")),
        key=lambda f: f.name,
    )
    parts = [HEADER]
    for f in files:
        text = f.read_text(encoding="utf-8")
        if '"""' in text or text.endswith("\\"):
            raise SystemExit(f"{f.name}: cannot be embedded as a raw string")
        parts.append(f'    "{f.name[: -len(".lua")]}": r"""{text}""",\n')
    parts.append("}\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        current = EMBEDDED.read_text(encoding="utf-8") if EMBEDDED.exists() else ""
        if current != text:
            print(f"{EMBEDDED} is out of date: run python -m scrapy_openclaw.distributed.lua", file=sys.stderr)
            return 1
        return 0
    EMBEDDED.write_text(text, encoding="utf-8")
    print(f"wrote {EMBEDDED}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
