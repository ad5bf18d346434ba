# The demo upstream's release, read statically by metax-audit (no import).
__version__ = "0.26.0+demo"
