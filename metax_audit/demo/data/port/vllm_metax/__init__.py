# Demo vendor port of the demo upstream's attention backends (synthetic, for metax-audit's demo).


def register() -> str:
    """Platform plugin entry point: the class path of the platform."""
    return "vllm_metax.platform.MacaPlatform"
