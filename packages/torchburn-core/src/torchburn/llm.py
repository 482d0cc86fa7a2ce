"""``python -m torchburn.llm``: the LLM runtime's commands (generate, chat, benchmark)."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from torchburn_cli.app import llm_main
    except ImportError:
        print("the LLM commands need the command line package: pip install 'torchburn[cli]'", file=sys.stderr)
        sys.exit(2)
    llm_main()


if __name__ == "__main__":
    main()
