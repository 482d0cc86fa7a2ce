"""The shifted Chebyshev polynomials as the plain ones at ``2x - 1``, so that an engine implementing the
eight orthogonal polynomials of the elementwise vocabulary (:data:`torchburn.planning.expr.POLYNOMIALS`)
covers the four shifted ones too. PyTorch switches to the trigonometric form at slightly different
degrees for the shifted kinds; both forms agree to float rounding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _shifted(plain: Any) -> Callable[[Any, Any], Any]:
    def shifted(x: Any, n: Any) -> Any:
        # x + x - 1 in the operand's own type, as PyTorch's kernel computes it
        return plain(x + x - 1, n)

    return shifted


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    getattr(getattr(aten, f"special_shifted_chebyshev_polynomial_{kind}"), overload): _shifted(
        getattr(getattr(aten, f"special_chebyshev_polynomial_{kind}"), overload)
    )
    for kind in "tuvw"
    for overload in ("default", "x_scalar", "n_scalar")
}
