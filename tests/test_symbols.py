

def test_the_names_a_text_binds_are_what_the_per_name_pattern_finds() -> None:
    # text_bound_names answers _text_defines for every name in one pass per module; the oracle is
    # the per-name pattern it replaced, asked for every word of a text with the tricky shapes.
    import re
    import textwrap

    from metax_audit.stages.trace.symbols import text_bound_names

    text = textwrap.dedent("""\
        from m import (alpha,
            beta)
        import pkg.sub as gamma  # import delta
        x_count: int = 0
        y_flag = 1
        z_cmp == 2
        first, second = 1, 2
        async def coro(a, b):
            inner = a
        class Klass(Base):
            field
            other)
        call(arg)
        value = {"key": import_like}
        try: import eps
        except ImportError: zeta = None
        s = "as theta"
        xas as iota
        reimport kappa, import lam
        alias mu; bias_nu
        rimport_ok = _as xi
        """)
    got = text_bound_names(text)
    for name in sorted(set(re.findall(r"\w+", text))):
        n = re.escape(name)
        pattern = (rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{n}\b|^[ \t]*{n}[ \t]*(?::|=(?!=)|,|\)?[ \t]*(?:#.*)?$)"
                   rf"|\bimport\b[^\n#]*\b{n}\b|\bas[ \t]+{n}\b")
        assert (re.search(pattern, text, re.MULTILINE) is not None) == (name in got), name
    assert {"alpha", "beta", "gamma", "delta", "x_count", "y_flag", "first", "coro", "inner", "Klass", "field", "other",
            "eps", "theta", "value", "iota", "lam"} <= got
    assert not {"z_cmp", "second", "call", "import_like", "Base", "mu", "xi"} & got
