import pytest

from search_spaces import available_spaces, compile_constraint, load_space


def test_named_spaces_have_an_unset_baseline():
    assert {"nvcc", "cc"} <= set(available_spaces())
    nvcc = load_space("nvcc")
    assert nvcc.toolchain == "nvcc"
    assert nvcc.baseline["maxrregcount"] == ""
    assert "-maxrregcount=64" in nvcc.flags["maxrregcount"]
    assert "-Xptxas -dlcm=cg" in nvcc.flags["dlcm"]
    assert load_space("cc").flags["opt_level"][0] == ""


def test_unknown_space_lists_known_ones():
    with pytest.raises(KeyError, match=r"known: .*nvcc"):
        load_space("fortran")


def test_space_file_relative_to_base(tmp_path):
    (tmp_path / "s.yaml").write_text("name: mine\ntoolchain: cc\nflags: {opt: ['', '-O2']}\n")
    space = load_space("s.yaml", base=tmp_path)
    assert space.name == "mine" and space.flags == {"opt": ("", "-O2")}
    (tmp_path / "bad.yaml").write_text("flags: {opt: []}\n")
    with pytest.raises(ValueError, match=r"flags\.opt"):
        load_space("bad.yaml", base=tmp_path)


@pytest.mark.parametrize(("expr", "values", "expected"), [
    ("BLOCK * UNROLL <= 4096", {"BLOCK": 1024, "UNROLL": 4}, True),
    ("BLOCK * UNROLL <= 4096", {"BLOCK": 1024, "UNROLL": 8}, False),
    ("BLOCK % 32 == 0 and UNROLL != 3", {"BLOCK": 96, "UNROLL": 2}, True),
    ("not (BLOCK > 512) or UNROLL == 1", {"BLOCK": 1024, "UNROLL": 2}, False),
    ("32 <= BLOCK < 64", {"BLOCK": 32, "UNROLL": 1}, True),
    ("max(BLOCK, UNROLL) == 64", {"BLOCK": 64, "UNROLL": 2}, True),
])
def test_constraints_evaluate(expr, values, expected):
    assert compile_constraint(expr, {"BLOCK": [], "UNROLL": []})(values) is expected


@pytest.mark.parametrize(("expr", "message"), [
    ("BLOCK <= TILE", "unknown name 'TILE'"),
    ("__import__('os').system('x')", "not allowed"),
    ("BLOCK.bit_length() > 3", "not allowed"),
    ("BLOCK <=", "not a valid expression"),
    ("[x for x in BLOCK]", "not allowed"),
])
def test_constraints_reject_anything_but_arithmetic(expr, message):
    with pytest.raises(ValueError, match=message):
        compile_constraint(expr, {"BLOCK": []})
