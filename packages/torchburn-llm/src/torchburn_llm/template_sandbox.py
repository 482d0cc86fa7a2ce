"""The sandbox a model's chat template renders in, with limits on time, size and depth.

Jinja's immutable sandbox keeps a template away from Python objects, files and the network, but not from
the machine's time and memory: ``{{ 'a' * 10**10 }}``, nested loops over ``range(100000)`` or a macro that
calls itself would run for hours, allocate gigabytes or end in a RecursionError. Here every place a
template spends work checks a budget before it spends it, cooperatively, so rendering really stops:

* every loop turn (each ``for`` iterable is wrapped at compile time), call, attribute or item lookup and
  intercepted operator counts a step and checks the deadline;
* what builds a string or a list (``*``, ``+``, ``~``, ``%``, ``.format``, ``.join``, ``.center`` and the
  other padding methods, the ``join``, ``center``, ``indent``, ``wordwrap``, ``replace``, ``format``,
  ``batch``, ``slice``, ``sum`` and ``tojson`` filters, a macro's or block's output) has its size
  estimated from its arguments first and is refused when that is over the limit, before it is built;
* calls nest at most ``depth`` deep (a recursive macro stops there, far from Python's recursion limit);
* integers stay small enough that arithmetic on them is instant.

Nothing is evaluated at compile time (``optimized=False``; output is finalized with the context), so
the same checks cover constant expressions. The caller streams the output and counts it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import string
import time
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, ValuesView
from dataclasses import dataclass, replace
from typing import Any

from jinja2 import nodes, pass_context, pass_environment, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import Extension
from jinja2.filters import make_attrgetter
from jinja2.nodes import EvalContext
from jinja2.parser import Parser
from jinja2.runtime import Context, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from .errors import ChatTemplateError

MAX_RANGE = 100_000  # Jinja's own sandbox limit for range()
MAX_INT_BITS = 1 << 14  # about Python's limit for printing an int (4300 digits)
# a %-format conversion: flags, width and precision (a '*' takes them from the arguments)
PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?.", re.DOTALL)


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may spend. Sizes count characters (or items of a list)."""

    seconds: float = 2.0
    chars: int = 4 << 20  # the output, and any one string or list the template builds
    built: int = 64 << 20  # every string and list the template builds, together
    steps: int = 1 << 20  # loop turns, calls, lookups and operators
    depth: int = 64  # calls inside calls: macros calling macros
    source: int = 1 << 20  # the template's own length

    def for_input(self, chars: int) -> TemplateLimits:
        """These limits with room for ``chars`` characters of messages: a long chat renders to a long prompt
        (up to 6 characters for each of the messages' own as JSON, when every one is escaped as \\uXXXX)."""
        return replace(self, chars=self.chars + 8 * chars, built=self.built + 64 * chars, steps=self.steps + 4 * chars)


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles loops and ``~`` to code that checks the render's budget."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        # each loop runs over environment.metered(<its iterable>), which counts its turns
        for loop in node.find_all(nodes.For):
            metered = nodes.EnvironmentAttribute("metered", lineno=loop.iter.lineno)
            loop.iter = nodes.Call(metered, [loop.iter], [], None, None, lineno=loop.iter.lineno)
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.join_pieces((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        markup = "context.eval_ctx.autoescape" if frame.eval_ctx.volatile else repr(bool(frame.eval_ctx.autoescape))
        self.write(f"), {markup})")


class GenerationBlocks(Extension):
    """``{% generation %}...{% endgeneration %}``, with which training templates mark the assistant's
    part (``transformers`` tracks it for loss masks): the block renders as its body."""

    tags = frozenset({"generation"})  # type: ignore[assignment]

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """An immutable sandbox that renders one template once under ``limits`` (it keeps the counts)."""

    intercepted_binops = frozenset({"+", "*", "%", "**"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, limits: TemplateLimits, **options: Any) -> None:
        super().__init__(optimized=False, **options)
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.steps = 0
        self.depth = 0
        self.built = 0
        self.finalize = self._finalize
        self.globals["range"] = self._range
        self.globals.pop("lipsum", None)  # placeholder text of any length: no use to a chat template
        for name, check in (
            ("center", self._check_center),
            ("indent", self._check_indent),
            ("wordwrap", self._check_wordwrap),
            ("replace", self._check_replace),
            ("format", self._check_format_filter),
            ("batch", self._check_batch),
            ("slice", self._check_slice),
            ("pprint", self._check_repr),
            ("string", self._check_repr),
        ):
            self.filters[name] = _checked(self.filters[name], check)
        self.filters["tojson"] = self._tojson
        self._join_filter = self.filters["join"]
        self.filters["join"] = self._join
        self.filters["sum"] = self._sum

    # --- the budget ---------------------------------------------------------------------------

    def fail(self, limit: str, what: str) -> ChatTemplateError:
        return ChatTemplateError(f"the chat template hit its {limit} limit: {what}")

    def tick(self) -> None:
        """One step of work: counted, and the deadline checked."""
        self.steps += 1
        if self.steps > self.limits.steps:
            raise self.fail("step", f"more than {self.limits.steps:,} loop turns, calls and lookups (an endless loop?)")
        self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise self.fail("time", f"rendering took longer than {self.limits.seconds:g} s (an endless loop?)")

    def charge(self, size: int, what: str) -> None:
        """Allow building ``what`` of ``size`` characters or items, or refuse before it is built."""
        if size > self.limits.chars:
            raise self.fail("size", f"{what} would hold {size:,} characters or items (at most {self.limits.chars:,})")
        self.built += size
        if self.built > self.limits.built:
            raise self.fail(
                "size",
                f"the strings and lists it built hold more than {self.limits.built:,} characters and items in all",
            )

    def check_int(self, bits: int) -> None:
        if bits > MAX_INT_BITS:
            raise self.fail("number", f"it computes an integer of about {bits:,} bits (at most {MAX_INT_BITS:,})")

    def weight(self, value: Any) -> tuple[int, int, int]:
        """About ``len(str(value))`` (a container's repr), the number of values in it and how deep they nest,
        counted without building anything; the count stops once past the size limit."""
        chars = count = deepest = 0
        stack: list[tuple[Any, int]] = [(value, 0)]
        while stack and chars <= self.limits.chars:
            item, depth = stack.pop()
            count += 1
            deepest = max(deepest, depth)
            if isinstance(item, str):
                chars += len(item) + (2 if depth else 0)  # quoted inside a container's repr
            elif isinstance(item, bytes | bytearray):
                chars += 4 * len(item) + 3
            elif isinstance(item, dict):
                chars += 2 + 4 * len(item)
                stack.extend((v, depth + 1) for pair in item.items() for v in pair)
            elif isinstance(item, list | tuple | set | frozenset | KeysView | ValuesView | ItemsView):
                chars += 2 + 2 * len(item)
                stack.extend((v, depth + 1) for v in item)
            elif isinstance(item, Namespace):
                attrs = getattr(item, "_Namespace__attrs", {})  # its repr shows them all
                chars += 16
                stack.append((attrs, depth + 1))
            elif isinstance(item, int):
                chars += item.bit_length() // 3 + 2
            else:
                chars += 24  # numbers, None, undefined values, loop and macro objects: short reprs
        return chars, count, deepest

    def size(self, value: Any) -> int:
        """About ``len(str(value))``."""
        if isinstance(value, str):  # most values: no walk needed
            return len(value)
        return self.weight(value)[0]

    # --- hooks Jinja's sandbox calls ----------------------------------------------------------

    def metered(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.tick()
            yield item

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.tick()
        return super().getitem(obj, argument)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.tick()
        if operator == "*":
            self._check_repeat(left, right)
        elif operator == "+":
            self._check_add(left, right)
        elif operator == "%" and isinstance(left, str):
            self._check_percent(left, right)
        elif operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            self.check_int(left.bit_length() * right)
        return super().call_binop(context, operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.tick()
        # Jinja passes the variables a loop or block has set as these, for the context; not the method's
        own = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}
        args = self._check_method(obj, args, own)
        if self.depth >= self.limits.depth:
            raise self.fail("depth", f"calls nest more than {self.limits.depth} deep (a macro that calls itself?)")
        self.depth += 1
        try:
            result = super().call(context, obj, *args, **kwargs)
        finally:
            self.depth -= 1
        if isinstance(result, str | bytes | list | tuple) and len(result) > self.limits.chars:
            raise self.fail(
                "size", f"a call returned {len(result):,} characters or items (at most {self.limits.chars:,})"
            )
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` and ``format_map``, sandboxed by Jinja, and sized first here."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        template: str = value.__self__
        is_map = value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            self.tick()
            self._check_format(template, args[0] if is_map and args else (args, kwargs))
            return wrapped(*args, **kwargs)

        return checked

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """A macro's, block's or ``{% set %}`` block's output, joined: sized first."""
        pieces = parts if isinstance(parts, list) else list(parts)
        self.charge(sum(len(p) for p in pieces), "a macro's or block's output")
        return "".join(pieces)

    def join_pieces(self, parts: tuple[Any, ...], markup: bool) -> str:
        """The ``~`` operator."""
        self.tick()
        self.charge(sum(self.size(p) for p in parts), "a string joined with ~")
        return markup_join(parts) if markup else str_join(parts)

    @pass_context
    def _finalize(self, context: Context, value: Any) -> Any:
        """Each ``{{ value }}`` before it is turned into text."""
        if not isinstance(value, str):
            self.charge(self.size(value), "an output value")
        return value

    def _range(self, *args: int) -> range:
        numbers = range(*args)
        try:
            count = len(numbers)
        except OverflowError:  # more than sys.maxsize numbers
            count = math.inf  # type: ignore[assignment]
        if count > MAX_RANGE:
            raise self.fail("range", f"range() of {count:,} numbers (at most {MAX_RANGE:,})")
        return numbers

    # --- operators and methods ----------------------------------------------------------------

    def _check_repeat(self, left: Any, right: Any) -> None:
        if _is_int(left) and _is_int(right):
            self.check_int(left.bit_length() + right.bit_length())
            return
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | bytearray | list | tuple) and _is_int(times):
                self.charge(len(seq) * max(times, 0), f"a {type(seq).__name__} repeated {times:,} times")

    def _check_add(self, left: Any, right: Any) -> None:
        if _is_int(left) and _is_int(right):
            self.check_int(max(left.bit_length(), right.bit_length()) + 1)
        elif isinstance(left, str | bytes | bytearray | list | tuple) and isinstance(right, type(left)):
            self.charge(len(left) + len(right), f"a {type(left).__name__} added to another")

    def _check_percent(self, template: str, args: Any) -> None:
        """``template % args``: each width and precision counts, and so does every argument's text."""
        room = len(template)
        for match in PERCENT.finditer(template):
            for number in match.groups():
                if number == "*":
                    raise self.fail("size", "a '*' width or precision in % formatting is not allowed")
                if number:
                    room += int(number) if len(number) < 10 else self.limits.chars + 1
        self.charge(room + self.size(args), "a %-formatted string")

    def _check_format(self, template: str, args: Any) -> None:
        """``template.format(...)``: each number in a format spec counts, and so does every argument's text."""
        room = len(template)
        for _, _, spec, _ in string.Formatter().parse(template):
            if not spec:
                continue
            if "{" in spec:
                raise self.fail("size", "a format spec taken from the arguments ('{:{}}') is not allowed")
            for number in re.findall(r"\d+", spec):
                room += int(number) if len(number) < 10 else self.limits.chars + 1
        self.charge(room + self.size(args), "a formatted string")

    def _check_method(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Size what a string or bytes method is about to build; ``join``'s iterable is read once here and
        handed on as a list. Returns the arguments to call with."""
        owner = getattr(obj, "__self__", None)
        method = getattr(obj, "__name__", "")
        if _is_int(owner) and method == "to_bytes":
            length = args[0] if args else kwargs.get("length", 1)
            if _is_int(length):
                self.charge(length, "the result of int.to_bytes()")
            return args
        if not isinstance(owner, str | bytes | bytearray):
            return args
        n = len(owner)
        if method in ("center", "ljust", "rjust", "zfill"):
            width = args[0] if args else kwargs.get("width", 0)
            if _is_int(width):
                self.charge(max(n, width), f"the result of .{method}()")
        elif method == "expandtabs":
            tabsize = args[0] if args else kwargs.get("tabsize", 8)
            if _is_int(tabsize):
                tabs = _count(owner, "\t" if isinstance(owner, str) else b"\t")
                self.charge(n + tabs * max(tabsize, 0), "the result of .expandtabs()")
        elif method == "replace" and len(args) >= 2:
            self._check_replace(owner, *args, **kwargs)
        elif method == "translate" and args:
            table = args[0]
            values = table.values() if isinstance(table, dict) else table if isinstance(table, list | tuple) else ()
            longest = max((self.size(v) for v in values if isinstance(v, str | bytes)), default=1)
            self.charge(n * max(longest, 1), "the result of .translate()")
        elif method == "join" and args:
            items = list(self.metered(args[0]))
            self.charge(sum(self.size(i) for i in items) + max(len(items) - 1, 0) * n, "the result of .join()")
            return (items, *args[1:])
        return args

    # --- filters ------------------------------------------------------------------------------

    def _check_center(self, value: Any, width: Any = 80) -> Any:
        self.charge(self.size(value) + (max(width, 0) if _is_int(width) else 0), "the result of |center")
        return value

    def _check_indent(self, value: Any, width: Any = 4, first: Any = False, blank: Any = False) -> Any:
        # Jinja builds the indentation string before it looks at the lines
        pad = len(width) if isinstance(width, str) else max(width, 0) if _is_int(width) else 0
        self.charge(pad, "|indent's indentation")
        size = self.size(value)
        lines = value.count("\n") + 2 if isinstance(value, str) else size + 2
        self.charge(size + lines * pad, "the result of |indent")
        return value

    def _check_wordwrap(
        self,
        value: Any,
        width: Any = 79,
        break_long_words: Any = True,
        wrapstring: Any = None,
        break_on_hyphens: Any = True,
    ) -> Any:
        size = self.size(value)
        self.charge(
            size + (size + 1) * (len(wrapstring) if isinstance(wrapstring, str) else 1), "the result of |wordwrap"
        )
        return value

    def _check_replace(self, value: Any, old: Any, new: Any, count: Any = None) -> Any:
        size = self.size(value)
        if isinstance(value, str | bytes | bytearray) and isinstance(old, type(value)):
            found = _count(value, old) if old else size + 1
        else:
            found = size + 1
        if _is_int(count) and count >= 0:
            found = min(found, count)
        self.charge(size + found * self.size(new), "a replaced string")
        return value

    def _check_format_filter(self, value: Any, *args: Any, **kwargs: Any) -> Any:
        self.charge(self.size(value), "|format's template")
        self._check_percent(str(value), kwargs or args)
        return value

    def _check_batch(self, value: Any, linecount: Any, fill_with: Any = None) -> Any:
        if _is_int(linecount):
            self.charge(max(linecount, 0), "the batches of |batch")
        return value

    def _check_slice(self, value: Any, slices: Any, fill_with: Any = None) -> Any:
        if _is_int(slices):
            self.charge(max(slices, 0), "|slice's slices")
        return value

    def _tojson(
        self,
        value: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        """``|tojson`` as ``transformers`` renders chat templates, which is how models saw their prompts in
        training: plain JSON with keys in their order and text as it is (Jinja's own filter sorts keys,
        escapes ``<``, ``>``, ``&`` and ``'`` for HTML and returns markup that escapes what it is joined
        with), sized before it is built."""
        chars, count, depth = self.weight(value)
        pad = len(indent) if isinstance(indent, str) else max(indent, 0) if _is_int(indent) else 0
        self.charge(6 * chars + count * (depth + 1) * (pad + 1), "the result of |tojson")  # \\uXXXX escapes: 6 each
        if separators is not None:
            separators = tuple(separators)
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def _check_repr(self, value: Any) -> Any:
        if not isinstance(value, str):  # a string's text is itself
            self.charge(2 * self.size(value), "the text of a value")
        return value

    @pass_eval_context
    def _join(self, eval_ctx: EvalContext, value: Iterable[Any], d: Any = "", attribute: Any = None) -> Any:
        """``|join``: its iterable read once, sized, then joined by Jinja's own filter."""
        items = self._items(value, attribute)
        self.charge(sum(self.size(i) for i in items) + max(len(items) - 1, 0) * self.size(d), "the result of |join")
        return self._join_filter(eval_ctx, items, d)

    @pass_environment
    def _sum(self, environment: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
        """``|sum`` one ``+`` at a time, each checked (a sum of lists or strings builds as it goes)."""
        total = start
        for item in self._items(iterable, attribute):
            self._check_add(total, item)
            total = total + item
        return total

    def _items(self, iterable: Iterable[Any], attribute: Any) -> list[Any]:
        items = list(self.metered(iterable))
        if attribute is None:
            return items
        getter = make_attrgetter(self, attribute)
        return [getter(i) for i in items]


def _is_int(value: Any) -> bool:
    return isinstance(value, int)


def _count(text: Any, part: Any) -> int:
    """Occurrences of ``part`` in ``text`` (both str, or both bytes-like)."""
    return int(text.count(part))


def _checked(original: Callable[..., Any], check: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a Jinja filter) run after ``check`` has sized it; ``check`` gets the filter's own
    arguments and returns the value to filter (an iterable it had to read, as a list)."""
    passes_first = getattr(original, "jinja_pass_arg", None) is not None  # the context, eval context or env

    @functools.wraps(original)  # keeps jinja_pass_arg: Jinja still passes what the filter asks for
    def run(*args: Any, **kwargs: Any) -> Any:
        first, (value, *rest) = (args[:1], args[1:]) if passes_first else ((), args)
        value = check(value, *rest, **kwargs)
        return original(*first, value, *rest, **kwargs)

    return run
