"""``FallbackError``: raised under ``options={"fallback": "error"}`` when an op would run eagerly."""

from __future__ import annotations

from torch._dynamo.exc import BackendCompilerFailed

from .errors import TorchBurnError


class FallbackError(BackendCompilerFailed, TorchBurnError):
    """Some nodes of the graph are not supported by the engine and ``fallback="error"`` forbids eager.

    It derives from Dynamo's ``BackendCompilerFailed`` so that Dynamo passes it through to the caller
    unchanged instead of wrapping it; ``ops`` maps each unsupported op to the engine's reason.
    """

    def __init__(self, engine: str, ops: dict[str, str], failure: str | None = None) -> None:
        self.engine = engine
        self.ops = dict(ops)
        self.failure = failure  # the engine's own error, when it accepted the ops but then failed on them
        lines = "\n".join(f"  {op}: {reason}" for op, reason in sorted(self.ops.items()))
        what = (
            f"does not support {len(self.ops)} op(s) of this graph"
            if failure is None
            else f"failed on a region of {len(self.ops)} op(s) ({failure})"
        )
        message = (
            f'engine {engine!r} {what} and options["fallback"] is "error":\n{lines}\n'
            'Use fallback="warn" (default) or "silent" to run them in PyTorch eager instead.'
        )
        Exception.__init__(self, message)
        self.backend_name = "torchburn"
        self.inner_exception = self
        self.first_useful_frame = None

    def __reduce__(self) -> tuple[type[FallbackError], tuple[str, dict[str, str], str | None]]:
        return (FallbackError, (self.engine, self.ops, self.failure))
