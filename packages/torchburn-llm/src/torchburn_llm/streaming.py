"""Turning a growing list of token ids into text pieces: never half a UTF-8 character, and never a
piece of a stop string before it is known whether the string completes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

INCOMPLETE = "\ufffd"  # what byte-level decoding yields for a character whose bytes are not all there


class TextStream:
    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already handed out
        self.stopped = False

    def push(self, token: int) -> str:
        """Add a token; return the text that is now safe to show (maybe empty)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for s in self.stop:
            at = text.find(s, max(0, self.sent - len(s)))
            if at != -1:
                self.stopped = True
                return self._take(text[:at])
        end = len(text)
        while end > self.sent and text[end - 1] == INCOMPLETE:
            end -= 1  # wait for the rest of the character
        end -= self._held_back(text[:end])
        return self._take(text[: max(end, self.sent)])

    def finish(self) -> str:
        """The text still held back once generation has ended without a stop string."""
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        return self._take(text)

    def _held_back(self, text: str) -> int:
        """How many trailing characters might be the start of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _take(self, text: str) -> str:
        piece = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return piece
