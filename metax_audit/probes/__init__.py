# Discriminating kernel probes: each asks one semantics question (LSE base, KV layout, FP8 scale,
# ...) of a target that follows a kernel family's calling convention. See metax_audit/probes/README.md.
from __future__ import annotations
