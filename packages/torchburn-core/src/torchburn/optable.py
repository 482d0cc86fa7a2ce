"""The op coverage table of an engine, read from its registry: ``python -m torchburn.optable [ENGINE]``.

``torchburn ops`` (the CLI) prints the same table.
"""

from __future__ import annotations

import argparse
import sys

from .engines.discovery import get_engine


def engine_ops(engine: str | None = None) -> list[dict[str, str]]:
    """One row per op the engine registers (op, family, dtypes, max_rank, layout), sorted by family."""
    from .engines.discovery import active_engine

    eng = get_engine(engine or active_engine())
    return eng.ops.rows()


def format_engine_ops(engine: str | None = None) -> str:
    """The coverage table as aligned text, with a per-family count at the end."""
    rows = engine_ops(engine)
    width = max((len(r["op"]) for r in rows), default=2)
    lines = [f"{'op':<{width}}  {'family':<14} {'dtypes'}"]
    families: dict[str, int] = {}
    for r in rows:
        lines.append(f"{r['op']:<{width}}  {r['family']:<14} {r['dtypes']}")
        families[r["family"]] = families.get(r["family"], 0) + 1
    lines.append("")
    lines.append(f"{len(rows)} ops: " + ", ".join(f"{f} {n}" for f, n in sorted(families.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchburn.optable", description=__doc__)
    parser.add_argument("engine", nargs="?", default=None, help="engine name (default: the active engine)")
    args = parser.parse_args(argv)
    print(format_engine_ops(args.engine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
