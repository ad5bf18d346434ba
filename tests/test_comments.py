# Tests for the comment reader: the marker styles a port uses for declared changes, and the
# comment directly above or beside a line.
from __future__ import annotations

import textwrap

import pytest

from metax_audit.core.comments import read_comments
from metax_audit.core.config import AuditConfig

MARKERS = AuditConfig().modification_markers


def _cm(src: str):
    return read_comments(textwrap.dedent(src), MARKERS)


def test_fenced_block_with_bracket_style() -> None:
    cm = _cm("""\
        x = 1
        # /------  Metax Modification ------\\
        # vendor kernel has no out= argument
        y = f(x)
        z = g(y)
        # \\------  Metax Modification ------/
        w = 3
        """)
    (block,) = cm.blocks
    assert (block.start, block.end, block.style) == (2, 6, "fenced")
    assert block.reason == "vendor kernel has no out= argument"
    assert cm.block_for(4) is block and cm.block_for(7) is None


def test_box_drawing_style_and_end_fence() -> None:
    cm = _cm("""\
        def f():
            # ┌---- Metax Modification ----┐
            a = 1
            # └---- Metax Modification ----┘
            # ---- Metax Modification: split path ----
            b = 2
            # ---- End ----
            return a + b
        """)
    assert [(b.start, b.end, b.reason) for b in cm.blocks] == [(2, 4, ""), (5, 7, "split path")]


def test_header_block_declares_the_next_statement() -> None:
    cm = _cm("""\
        class B:
            # /---- Metax Modification ----\\
            # Note: no cascade on this device
            # \\---- Metax Modification ----/
            def cascade(self):
                raise NotImplementedError

            def other(self):
                pass
        """)
    (block,) = cm.blocks
    assert block.reason == "Note: no cascade on this device"
    assert block.covers(6) and not block.covers(8)


def test_single_line_marker_and_trailing_marker() -> None:
    cm = _cm("""\
        # Metax Modification: vendor op
        from vendor.ops import merge

        y = merge(1,  # metax: lse in base 2
                  2)
        """)
    line, trailing = cm.blocks
    assert line.style == "line" and line.reason == "vendor op" and line.covers(2)
    assert trailing.style == "trailing" and trailing.start == 4 and "lse in base 2" in trailing.reason


def test_unterminated_block_covers_the_next_statement_only() -> None:
    cm = _cm("""\
        # ---- Metax Modification ----
        a = 1
        b = 2
        """)
    (block,) = cm.blocks
    assert block.style == "unterminated" and block.covers(2) and not block.covers(3)


def test_comment_above_and_trailing() -> None:
    cm = _cm("""\
        x = 1

        # -------------
        # Note: use the vendor merge
        # -------------
        y = 2  # keep in sync
        z = 3
        """)
    assert cm.comment_above(6) == "Note: use the vendor merge"
    assert cm.comment_above(7) is None
    assert cm.comment_above(1) is None
    assert cm.trailing(6) == "keep in sync"
    assert cm.blocks == ()


@pytest.mark.parametrize("src", ["x = (\n", "def f(:\n  pass\n"])
def test_broken_source_does_not_raise(src: str) -> None:
    read_comments(src + "# Metax Modification: x\n", MARKERS)


# scan_comments answers for a source that parses what tokenize answers: the same comments (text, and
# whether code precedes each on its line) and the same lines holding code. The shapes below are the ones
# a scan of comments and literals alone could get wrong.
SCAN_SHAPES = {
    "hash in literals": 'x = "a # not a comment"  # real\ny = \'#\' + "#"\n',
    "quote in comment": "x = 1  # it's \"quoted\"\n# don't\ny = 2\n",
    "triple quoted": 'def f():\n    """Doc with # inside\n\n    # an indented look-alike\n    """\n    return 1  # after\n',
    "triple single": "s = '''a\n# no\n'''  # yes\n",
    "quotes inside triple": 's = """ "x" \'y\' ""z"" """  # c\n',
    "implicit concatenation": 'x = (\n    "a"\n    # between the pieces\n    "b"\n)\n',
    "escapes": 'x = "a\\"# b"  # c\ny = \'\\\\\'  # d\n',
    "continued literal": 'x = "a\\\nb # in"  # out\n',
    "backslash continuation": "x = 1 + \\\n    2  # two\n",
    "prefixes": 'a = rb"\\d#"  # r\nb = f"{x!r:>10}#"  # f\nc = Rb\'\'\'\n#\n\'\'\'\n',
    "f-string braces": 'x = f"{a[\'k\']} # {b}"  # end\n',
    "blank lines and comment-only lines": "\n\n# top\n\n\ndef g():\n\n    # inside\n    pass\n# bottom\n",
    "comment at end without newline": "x = 1\n# last",
    "empty comment": "x = 1  #\n#\n",
    "tabs and form-free whitespace": "if x:\n\ty = 1\t# tab\n",
    "nested brackets across lines": "call(\n    a,  # first\n    # alone\n    b,\n)\n",
    "multi-line string with blank lines": 'x = """\n\n\n"""\ny = 1\n',
}


@pytest.mark.parametrize("source", SCAN_SHAPES.values(), ids=SCAN_SHAPES.keys())
def test_the_comment_scan_answers_what_tokenize_answers(source: str) -> None:
    import ast

    from metax_audit.core.comments import scan_comments, tokenized_comments

    ast.parse(source)  # the scan is only asked about sources that parse
    scanned = scan_comments(source)
    assert scanned is not None
    assert scanned == tokenized_comments(source)


def test_odd_line_breaks_leave_the_comments_to_tokenize() -> None:
    from metax_audit.core.comments import scan_comments

    assert scan_comments("x = 1\r# c\r") is None
    assert scan_comments("x = 1  # a\x0cb\n") is None


def test_a_parsed_source_and_a_tokenized_one_read_the_same_blocks() -> None:
    import ast

    source = textwrap.dedent("""\
        x = 1
        # /------  Metax Modification ------\\\\
        # vendor kernel has no out= argument
        y = f(x)  # "#" kept
        s = '''
        # ---- Metax Modification: not a block, a string
        '''
        # \\\\------  Metax Modification ------/
        z = g(y)
        """)
    fast = read_comments(source, MARKERS, ast.parse(source))
    slow = read_comments(source, MARKERS)
    assert fast == slow and fast.blocks and 6 not in fast.comments
