# The `claim` check: capability comments paired with the code under them, enforced (raise,
# assert, switch) or comment only, and negative claims whose listed names the code still uses.
from __future__ import annotations

from pathlib import Path

import pytest

from metax_audit.core.models import Discovery, SourceFile
from metax_audit.stages.checks.claims import check_claims, claims_in


def run(root: Path, text: str) -> list[tuple[int, str]]:
    (root / "port").mkdir(exist_ok=True)
    (root / "port/x.py").write_text(text)
    d = Discovery(root, "port", (SourceFile("port/x.py", "port.x", "glob"),), (), (), (), {})
    return [(f.location.line, f.rule) for f in check_claims(d)]


CASES = {
    "raise enforces": ("def f(x):\n    # fp8 is not supported here\n    if x:\n        raise NotImplementedError('fp8')\n", [(2, "MXA141")]),
    "assert enforces": ("def f(x):\n    # only supports contiguous input\n    assert x.is_contiguous()\n", [(2, "MXA141")]),
    "switch enforces": ("class C:\n    def use(self):\n        # cascade doesn't work, disable it\n        return False\n", [(3, "MXA141")]),
    "comment only": ("def f(x):\n    # the kernel cannot handle an fp8 kv cache\n    return g(x)\n", [(2, "MXA140")]),
    # MXA140 only where the comment names what a check or probe can decide (dtype, head size, arch, layout, block size).
    "a claim naming no checkable property is not a finding": ("def f(x):\n    # the kernel cannot handle sliding windows\n    return g(x)\n", []),
    "head size claim": ("def f(x):\n    # only supports head sizes 64 and 128\n    return g(x)\n", [(2, "MXA140")]),
    "arch claim": ("def f(x):\n    # not supported on Hopper\n    return g(x)\n", [(2, "MXA140")]),
    "block size claim": ("def f(x):\n    # the kernel does not support block size 32\n    return g(x)\n", [(2, "MXA140")]),
    "trailing comment": ("def f(kv):\n    y = kv.permute(0, 2, 1)  # HND and contiguous\n    return y\n", [(2, "MXA140")]),
    "trailing contiguous enforced": ("def f(kv):\n    y = kv.permute(0, 2, 1).contiguous()  # contiguous\n    return y\n", [(2, "MXA141")]),
    "descriptive contiguous in a block comment is not a claim": (
        "def f(reqs):\n    # find the end of this bucket (contiguous requests)\n    return g(reqs)\n", []),
    "contiguous stated as a requirement is a claim": (
        "def f(kv):\n    # the cache must be contiguous here\n    return g(kv)\n", [(2, "MXA140")]),
    "phrase inside a condition is not a claim": (
        "def f(x):\n    # check if the fast path is supported on this platform\n    return g(x)\n", []),
    "purpose clause is not a claim": (
        "def f(x):\n    # shared by both paths so the two cannot drift\n    return g(x)\n", []),
    "claim after a condition clause still counts": (
        "def f(x):\n    # when fp8 is on, the kernel does not support sliding windows\n    return g(x)\n", [(2, "MXA140")]),
    "padding to the limit handles the claim": (
        "def f(q, n):\n    # the kernel only supports 64 or 128 heads\n    q = pad_heads(q, 64 if n <= 64 else 128)\n    return q\n",
        [(2, "MXA141")]),
    "no claim words": ("def f(x):\n    # compute the output\n    return x\n", []),
    "commented-out code is not a claim": ("def f(x):\n    # return supported(x, contiguous=True)\n    return x\n", []),
    "listed name used": ("# Note: does not support:\n#   - FancyWrapper\nfrom k import FancyWrapper\nw = FancyWrapper()\n", [(1, "MXA142")]),
    "name before the phrase is not its object": ("# The `fancy_kernel` cannot handle head dims above 256, so round down.\nx = fancy_kernel(1)\n", [(1, "MXA140")]),
    "listed name unused": ("# Note: does not support fp8:\n#   - FancyWrapper\nfrom k import Other\n", [(1, "MXA140")]),
}


@pytest.mark.parametrize(("text", "expected"), CASES.values(), ids=CASES.keys())
def test_claim_table(tmp_path: Path, text: str, expected: list[tuple[int, str]]) -> None:
    assert run(tmp_path, text) == expected


def test_block_comment_is_one_claim() -> None:
    claims = claims_in("# /---- note ----\\\n# Currently it does not support:\n#  - A\n# \\----\nx = 1\n")
    assert [(c.line, c.end, c.phrase) for c in claims] == [(1, 4, "does not support")]


# _comments read from a parsed source (comments.scan_comments) equals tokenize's reading; only line breaks
# tokenize counts differently leave it to tokenize.
COMMENT_CASES = {
    "trailing after a string holding '#'": ('x = "a # b"  # real one\ny = 1\n', True),
    "string only": ('x = "# not a comment"\n', True),
    "bytes and f-string": ('x = b"#"  # c1\ny = f"{x}#"  # c2\n', True),
    "comment inside brackets": ("f(a,  # first\n  # own line\n  b)\n", True),
    "standalone and indented": ("# top\ndef f():\n    # inside\n    return 1  # trailing\n", True),
    "docstring line starting with #": ('def f():\n    """Doc.\n    # not a comment\n    """\n    return 1  # c\n', True),
    "multi-line literal crossing a code line with #": ('x = ("a"  # c\n     "b")  # d\n', True),
    "comment between concatenated pieces": ('x = ("a"\n# c\n"b")\n', True),
    "comment after a literal's closing line": ('x = """doc\n# text """  # real\ny = 1\n', True),
    "multi-line literal away from comments": ('x = """doc\ntext"""\ny = 1  # c\n', True),
    "lone carriage return": ("x = 1  # a\ry = 2\n", None),
}


@pytest.mark.parametrize("case", sorted(COMMENT_CASES))
def test_comments_from_the_tree_equal_tokenize(case: str) -> None:
    import ast

    from metax_audit.core.comments import scan_comments, tokenized_comments
    from metax_audit.stages.checks.claims import _comments

    source, fast = COMMENT_CASES[case]
    got = scan_comments(source)
    assert (got is not None) is bool(fast), got
    assert _comments(source, ast.parse(source)) == _comments(source)  # tokenize's reading, with or without the tree
    if got is not None:
        assert got[0] == tokenized_comments(source)[0]
        assert _comments(source) == sorted((c.line, c.text, c.trailing) for c in got[0].values())
