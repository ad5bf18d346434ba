# Demo stand-ins for the compiled cache ops that every backend calls before attention.
from __future__ import annotations


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """Write new K/V rows into the paged cache at `slot_mapping` (a no-op in the demo)."""
    return None
