# Kernels metax-audit ships and probes itself (the H2O score kernel); importing this package
# loads neither torch nor triton: the kernels are built on first call.
from __future__ import annotations

from metax_audit.stages.probing.kernels.h2o import block_scores, h2o_scores, triton_available
from metax_audit.stages.probing.kernels.h2o_reference import block_scores_reference, h2o_scores_reference

__all__ = ["block_scores", "block_scores_reference", "h2o_scores", "h2o_scores_reference", "triton_available"]
