import pytest

from cluster.core.placeholders import expand, names_in


def test_list_placeholder_splices_and_scalar_substitutes():
    template = ["nvcc", "{flags}", "{defines}", "-arch={arch}", "-o", "{binary}", "{sources}"]
    argv = expand(template, {"flags": ["-O3", "--use_fast_math"], "defines": [], "arch": "sm_90",
                             "binary": "/tmp/x", "sources": ["a.cu", "b.cu"]})
    assert argv == ["nvcc", "-O3", "--use_fast_math", "-arch=sm_90", "-o", "/tmp/x", "a.cu", "b.cu"]


def test_empty_list_leaves_no_empty_argument():
    assert expand(["cc", "{flags}", "x.c"], {"flags": []}) == ["cc", "x.c"]


def test_values_with_spaces_stay_one_argument():
    # No shell: a value with spaces or metacharacters is one argument, never split or run.
    assert expand(["{binary}", "--name={n}"], {"binary": "/a b/c", "n": "x; rm -rf /"}) == \
        ["/a b/c", "--name=x; rm -rf /"]


def test_escaped_braces_and_names():
    assert expand(["{{literal}}", "{n}"], {"n": 3}) == ["{literal}", "3"]
    assert names_in(["{{x}}", "-D{A}={B}", "{flags}"]) == {"A", "B", "flags"}


def test_unknown_placeholder_raises_key_error():
    with pytest.raises(KeyError, match="nope"):
        expand(["{nope}"], {})
