# One module per kernel family (calling convention) with its built-in target adapters:
# paged-decode, paged-prefill, ragged-prefill, merge-states, dcp-local-seq-lens.
from __future__ import annotations
