# Demo MACA merge of two partial attention results; stands in for the vendor kernel, which
# takes natural-log (base e) log-sum-exp values like upstream's merge_attn_states.
from __future__ import annotations

import math


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None):
    """Merge two partial results; prefix_lse and suffix_lse are base-e log-sum-exp values."""
    for i, (pa, sa) in enumerate(zip(prefix_lse, suffix_lse, strict=True)):
        m = max(pa, sa)
        wa, wb = math.exp(pa - m), math.exp(sa - m)
        total = wa + wb
        output[i] = [(wa * x + wb * y) / total for x, y in zip(prefix_output[i], suffix_output[i], strict=True)]
        if output_lse is not None:
            output_lse[i] = m + math.log(total)
    return output
