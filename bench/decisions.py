"""Every decision the engine makes on the tests' inputs, recorded or compared (not a test).

The command of ``tests/harness/decisions.py`` (its docstring says what is recorded and
how to compare two checkouts), loaded from its file alone: not through the ``harness``
package, which imports this tree's ``webhook`` before ``--tree`` can choose another.

    python bench/decisions.py --inputs /tmp/in.pickle --write /tmp/before.jsonl --tree /tmp/base
    python bench/decisions.py --inputs /tmp/in.pickle --check /tmp/before.jsonl
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tests" / "harness" / "decisions.py"


def main() -> int:
    spec = importlib.util.spec_from_file_location("runguard_decisions", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    code: int = tool.main()
    return code


if __name__ == "__main__":
    sys.exit(main())
