"""Constrained decoding with llguidance: a JSON schema (``response_format``, tool calls) becomes a
matcher that, before each token, says which of the vocabulary may come next. The sampler only sees
those, so the answer parses and validates whatever the model would have preferred."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from .errors import bad_request

# JSON as compact as the schema allows: a small model given free whitespace may indent forever
_JSON_OPTIONS: Any = {"whitespace_flexible": False}
# a schema's grammar is built under these bounds (a hostile schema must not take the server's memory)
_MAX_SCHEMA_BYTES = 64 << 10


class Vocabulary:
    """The model's tokenizer as llguidance sees it (built once per model: about a second)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        import llguidance

        self.size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(eos_ids))

    def json_schema(self, schema: dict[str, Any], param: str) -> Constraint:
        """A matcher for JSON text valid against ``schema``; a schema llguidance cannot compile is a 400
        naming ``param``."""
        import llguidance

        text = json.dumps(closed_objects(schema))
        if len(text) > _MAX_SCHEMA_BYTES:
            raise bad_request(f"the JSON schema is {len(text):,} bytes; at most {_MAX_SCHEMA_BYTES:,}", param)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=_JSON_OPTIONS)
        except ValueError as exc:
            raise bad_request(f"the JSON schema is not usable: {exc}", param) from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise bad_request(f"the JSON schema is not usable: {'; '.join(messages)}", param)
        return Constraint(llguidance.LLMatcher(self.tokenizer, grammar, log_level=0), self.size)


# where a schema nests schemas: under a mapping of names, alone, or in a list
_NAMED_SUBSCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = (
    *("items", "additionalItems", "additionalProperties", "unevaluatedProperties", "contains"),
    *("propertyNames", "not", "if", "then", "else"),
)
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")


def closed_objects(schema: Any, in_all_of: bool = False) -> Any:
    """``schema`` with every object that lists its ``properties`` but says nothing of others closed to
    them (``additionalProperties: false``), as llama.cpp's grammars and xgrammar's strict mode read
    schemas: JSON schema lets such an object take any other key, and a model given that freedom (a tool's
    arguments, typically declared without it) keeps inventing keys until ``max_tokens``. What comes out
    still validates against the schema as given. The parts of an ``allOf`` stay open, since each may
    list only some of the properties the whole allows."""
    if isinstance(schema, list):  # draft 4's tuple form of items
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _NAMED_SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = closed_objects(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(sub) for sub in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(sub, in_all_of=True) for sub in out["allOf"]]
    open_keys = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if "properties" in out and not in_all_of and not any(key in out for key in open_keys):
        out["additionalProperties"] = False
    return out


class GrammarError(RuntimeError):
    """A request's grammar cannot go on (llguidance gave up on it, over one of its limits)."""


class Constraint:
    """One request's matcher: the allowed tokens before each step, then the token taken."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher, self.size = matcher, vocab_size

    def allowed(self) -> torch.Tensor:
        """Whether each token may come next: bool [V]."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.size].astype(bool))

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [V] with the tokens the grammar forbids at -inf."""
        return logits.masked_fill(~self.allowed(), float("-inf"))

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise GrammarError(f"token {token} refused: {self.error}")

    @property
    def done(self) -> bool:
        """The grammar is complete and takes nothing more (EOS aside)."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        """What stopped the matcher, in one line (llguidance follows it with a dump of its state)."""
        return str(self.matcher.get_error() or "").split("\n", 1)[0]
