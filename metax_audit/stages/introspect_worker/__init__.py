# Standalone introspection worker, run with the *target* interpreter: imports each dotted target
# and prints what is installed (signature, source, docs, dist/wheel) as JSON lines. Stdlib only.
# __main__.py starts it (introspect.worker_command runs that file by path); fence.py keeps the port
# out; imported.py and static.py read a target by importing it or from its source; schemas.py reads
# a C++-registered op's documented schema; signatures.py holds the fact record and the signature
# readers; protocol.py the request/answer loop.
#
#
# Protocol: a JSON request on stdin {"targets": [...], "extra_path": [...], "static_roots": [...],
# "static_only": bool}; stdout gets one JSON object per line: {"event": "start", "target": t}
# before each target (so a hang or crash is attributable), {"event": "fact", ...} after it, and a
# final {"event": "done", ...}. Every failure is a value; nothing here raises out of main().
# A first line {"preload": [packages], "extra_path": [...]} may come ahead of the request: the
# worker imports those while the parent is still working out the targets.
