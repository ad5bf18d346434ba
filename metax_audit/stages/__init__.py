# The review's stages, one module or package each, in pipeline order: snapshot -> discover ->
# upstream -> trace -> introspect -> compare -> checks (dataflow beside them) -> probing -> triage ->
# inventory. A stage imports the core and earlier stages only; pipeline/ runs them.
