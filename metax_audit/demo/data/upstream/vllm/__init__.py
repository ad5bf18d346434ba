# Synthetic, vLLM-shaped upstream package for the metax-audit demo (written for the demo, not vLLM code).
__version__ = "0.26.0+demo"
