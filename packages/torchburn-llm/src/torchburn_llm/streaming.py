"""Turning a growing list of token ids into text pieces: never half a UTF-8 character, and never a
piece of a stop string before it is known whether the string completes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

INCOMPLETE = "\ufffd"  # what byte-level decoding yields for a character whose bytes are not all there


class TextStream:
    """Decodes incrementally: each token decodes a short window of the last few ids (from the start of
    the piece before it, so that a decoder's handling of a window's first token cancels out), never the
    whole answer again, so a token costs the same at position 2,000 as at 20."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # the text of ids[:read], decoded piece by piece
        self.prefix = 0  # where the window starts: the first id of the last piece added to `text`
        self.read = 0  # ids up to here are in `text`
        self.sent = 0  # characters of `text` already handed out
        self.stopped = False
        self.stopped_by: str | None = None  # the stop string that ended the text

    def push(self, token: int) -> str:
        """Add a token; return the text that is now safe to show (maybe empty)."""
        self.ids.append(token)
        piece = self._piece()
        if piece and not piece.endswith(INCOMPLETE):  # else wait for the rest of the character
            self.text += piece
            self.prefix, self.read = self.read, len(self.ids)
        text = self.text
        for s in self.stop:
            at = text.find(s, max(0, self.sent - len(s)))
            if at != -1:
                self.stopped, self.stopped_by = True, s
                return self._take(text[:at])
        end = len(text) - self._held_back(text)
        return self._take(text[: max(end, self.sent)])

    def finish(self) -> str:
        """The text still held back once generation has ended without a stop string."""
        if self.stopped:
            return ""
        return self._take(self.text + self._piece())

    def _piece(self) -> str:
        """The text that ids[read:] add after ids[:read]."""
        if self.read == len(self.ids):
            return ""
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        window = decode(self.ids[self.prefix :], skip_special_tokens=True)
        if window.startswith(before):
            return str(window[len(before) :])
        # a decoder that rewrites across the window's edge: the whole text once
        return str(decode(self.ids, skip_special_tokens=True))[len(self.text) :]

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
