# Pure-Python stand-in for the FlashInfer 0.2.x kernel package used by the metax-audit demo:
# the wrapper signatures are the contract; the bodies only record what they were given.
from flashinfer.cascade import MultiLevelCascadeAttentionWrapper, merge_state
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper

__version__ = "0.2.6+demo"

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "merge_state",
]
