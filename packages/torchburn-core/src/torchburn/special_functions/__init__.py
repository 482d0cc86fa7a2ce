"""``torch.special`` and its kin as elementwise arithmetic, for engines that lack them.

Each function is written with the ops every engine has (arithmetic, ``exp``/``log``/trigonometry,
comparisons and ``where``): piecewise rational and Chebyshev-series approximations, the same ones
PyTorch's CPU kernels evaluate, each branch computed everywhere and the right one selected. The traced
result is one fused elementwise sweep on every engine. Computation stays in the operand's float type
(half types in float32), so results agree with eager's to float rounding.

- :mod:`.gamma`: the gamma family and the normal distribution's functions
- :mod:`.bessel`: Bessel functions and the Airy function
- :mod:`.polynomials`: the shifted Chebyshev polynomials (the plain ones are engine functions)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import bessel, gamma, polynomials

DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    **bessel.DECOMPOSITIONS,
    **gamma.DECOMPOSITIONS,
    **polynomials.DECOMPOSITIONS,
}
