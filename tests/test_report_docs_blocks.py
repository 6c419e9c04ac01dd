"""Generated blocks in a hand-written markdown file."""

from kvbench.tasks.report.docs_blocks import block, replace_blocks


def test_blocks_are_replaced_and_the_rest_is_kept():
    text = f"intro\n{block('a', 'one')}\nmiddle\n{block('b', 'two')}\nend"
    new, missing = replace_blocks(text, {"a": "ONE", "c": "x"})
    assert new == f"intro\n{block('a', 'ONE')}\nmiddle\n{block('b', 'two')}\nend"
    assert missing == ["c"]


def test_a_body_with_regex_specials_is_inserted_verbatim():
    new, _ = replace_blocks(block("a", "x"), {"a": r"\1 $5 \\g<0>"})
    assert r"\1 $5 \\g<0>" in new
