# Checks: generators of findings over the traced, introspected and compared model.
# One module per concern; each declares its rules in metax_audit.findings at import time.
