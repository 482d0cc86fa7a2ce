"""A reasoning model's thinking apart from its answer, as llama-server returns it (``reasoning_format``
"auto", its default): text inside ``<think>...</think>`` (Qwen3, QwQ, DeepSeek-R1 and its distills) goes
to ``reasoning_content``, the rest to ``content``. A template may open the block itself (DeepSeek-R1's
ends the prompt with ``<think>``): the answer then starts inside it and only closes it."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the chat template's prompt leaves the model inside a thinking block."""
    return prompt.rstrip().endswith(OPEN)


class ReasoningSplitter:
    """Splits an answer's text, as it streams, into (reasoning, content) pieces. Text that may be the
    start of a tag is held back until the next piece says what it is."""

    def __init__(self, inside: bool) -> None:
        self._state = "inside" if inside else "start"
        self._pending = ""

    def push(self, text: str) -> tuple[str, str]:
        """The reasoning and content that ``text`` (the next piece of the answer) completes."""
        self._pending += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._pending:
            if self._state == "start":  # does the answer open a block (after blank space)?
                head = self._pending.lstrip()
                if len(head) < len(OPEN) and OPEN.startswith(head):
                    break  # blank, or part of the tag: wait for more
                if head.startswith(OPEN):
                    self._pending, self._state = head[len(OPEN) :], "inside"
                else:
                    self._state = "content"
            elif self._state == "inside":
                at = self._pending.find(CLOSE)
                if at >= 0:
                    reasoning.append(self._pending[:at])
                    self._pending, self._state = self._pending[at + len(CLOSE) :], "after"
                    continue
                keep = _partial_tag(self._pending, CLOSE)
                reasoning.append(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                break
            elif self._state == "after":  # the blank lines between the block and the answer
                self._pending = self._pending.lstrip()
                if self._pending:
                    self._state = "content"
            else:
                content.append(self._pending)
                self._pending = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back, once the answer has ended."""
        held, self._pending = self._pending, ""
        if self._state == "inside":
            return held, ""  # cut short while thinking
        return "", "" if self._state == "after" else held


def pieces(splitter: ReasoningSplitter | None, text: str, last: bool) -> tuple[str, str]:
    """(reasoning, content) of the next piece of a streamed answer (``last``: the answer ends with it);
    without a splitter, all of it is content."""
    if splitter is None:
        return "", text
    reasoning, content = splitter.push(text)
    if last:
        more_reasoning, more_content = splitter.finish()
        reasoning, content = reasoning + more_reasoning, content + more_content
    return reasoning, content


def split(text: str, inside: bool) -> tuple[str, str]:
    """A whole answer's (reasoning, content)."""
    splitter = ReasoningSplitter(inside)
    reasoning, content = splitter.push(text)
    more_reasoning, more_content = splitter.finish()
    return reasoning + more_reasoning, content + more_content


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
