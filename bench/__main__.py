"""``python -m bench``: run every benchmark module of this package, one after the other, each in its own
interpreter (so that one benchmark's memory and imports do not colour the next one's numbers).

Extra arguments are passed to every module (``python -m bench --quick``); a module that does not
know an argument fails, so pass arguments only when every module accepts them, or run a module
alone: ``python -m bench.sim --quick``.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import time
from pathlib import Path


def modules() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    failed: list[str] = []
    for name in modules():
        print(f"=== bench.{name} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}", *args])
        print(f"=== bench.{name}: exit {rc}, {time.perf_counter() - t0:.1f} s ===\n", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
