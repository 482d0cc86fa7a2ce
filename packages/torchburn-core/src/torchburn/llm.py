"""``python -m torchburn.llm``: the LLM runtime's commands (generate, chat, benchmark)."""

from __future__ import annotations

import sys


def main() -> None:
    from .parts import load_part

    try:
        llm_main = load_part("llm_main", "the LLM commands need the command line package (torchburn-cli)", "cli")
    except ImportError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    llm_main()


if __name__ == "__main__":
    main()
