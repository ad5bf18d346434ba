# Demo merge of two partial attention results by their log-sum-exp (natural log, base e),
# as used by chunked prefill and decode context parallelism.
from __future__ import annotations

import math


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None):
    """Merge two partial results row by row.

    prefix_lse and suffix_lse are natural-log (base e) log-sum-exp values, one per row.
    Rows are plain sequences of floats in the demo.
    """
    for i, (pa, sa) in enumerate(zip(prefix_lse, suffix_lse, strict=True)):
        m = max(pa, sa)
        wa, wb = math.exp(pa - m), math.exp(sa - m)
        total = wa + wb
        output[i] = [(wa * x + wb * y) / total for x, y in zip(prefix_output[i], suffix_output[i], strict=True)]
        if output_lse is not None:
            output_lse[i] = m + math.log(total)
    return output
