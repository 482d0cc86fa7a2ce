"""The shapes ``aten._scaled_dot_product_flash_attention_for_cpu`` accepts, checked once for every engine.

PyTorch's flash attention takes ``q [b, h, tq, d]``, ``k [b, hk, tk, d]``, ``v [b, hk, tk, dv]`` where
``hk`` divides ``h`` (grouped-query attention: ``scaled_dot_product_attention(..., enable_gqa=True)``
reaches the op that way, with k/v of fewer heads), and query head ``i`` reads key/value head
``i // (h // hk)``. An engine that claims the op must honour that mapping or decline the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _same(a: Any, b: Any) -> bool:
    """Equal sizes; symbolic sizes count as equal only when they are the same expression."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return str(a) == str(b)


def _may_agree(a: Any, b: Any) -> bool:
    """Sizes the op requires equal: two different symbols may still be (a KV cache's keys and values
    grow as two symbols of one length), so only two unequal integers disagree here; an engine plans
    with the concrete sizes and checks them again then."""
    return not (isinstance(a, int) and isinstance(b, int)) or a == b


def grouped_heads(q: Sequence[Any], k: Sequence[Any], v: Sequence[Any]) -> int | str:
    """Query heads per key/value head (1 without grouping), or why the shapes are not attention's."""
    if not len(q) == len(k) == len(v) == 4:
        return "attention needs 4-D q, k and v"
    if not (_may_agree(q[0], k[0]) and _may_agree(q[0], v[0])):
        return f"attention batch sizes differ: q {q[0]}, k {k[0]}, v {v[0]}"
    if not (_may_agree(q[3], k[3]) and _may_agree(k[2], v[2]) and _same(k[1], v[1])):
        return f"attention shapes do not agree: q {list(q)}, k {list(k)}, v {list(v)}"
    h, hk = q[1], k[1]
    if _same(h, hk):
        return 1
    if not (isinstance(h, int) and isinstance(hk, int)):
        return f"symbolic head counts {h} (queries) and {hk} (keys/values)"
    if hk <= 0 or h % hk:
        return f"{h} query heads do not split into {hk} key/value heads"
    return h // hk
