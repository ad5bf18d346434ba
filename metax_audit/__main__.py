# `python -m metax_audit` runs the same CLI as the console script.
from metax_audit.cli import main

main()
