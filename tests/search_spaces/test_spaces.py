import pytest

from search_spaces import available_spaces, compile_constraint, load_space


def test_named_spaces_have_an_unset_baseline():
    assert {"nvcc", "cc"} <= set(available_spaces())
    nvcc = load_space("nvcc")
    assert nvcc.toolchain == "nvcc"
    assert nvcc.baseline["maxrregcount"] == ""
    assert "-maxrregcount=64" in nvcc.flags["maxrregcount"]
    assert "-Xptxas -dlcm=cg" in nvcc.flags["dlcm"]
    assert load_space("cc").flags["opt_level"][0] == "-O2"  # a user's build, not -O0


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


@pytest.mark.parametrize(("expr", "message"), [
    ("9 ** 9 ** 9 > 0", "a power past 4096 bits"),  # hung
    ("'a' * 10**10 == 'a'", "a string longer than 10000 characters"),  # exhausted memory
    ("BLOCK / 0 > 1", None),  # a traceback; compiles, and is False wherever it divides by zero
    ("'%09999999d' % BLOCK == ''", None),  # string formatting: no value anywhere
    ("BLOCK ** BLOCK ** BLOCK > 1", None),  # a tower of params: no value where it is too big
    ("x" * 1001, "longer than 1000 characters"),
    ("min() > 1", "not allowed"),
    ("BLOCK if BLOCK else 1", "not allowed"),
])
@pytest.mark.timeout(60)  # a guard against the hang an unbounded one is (milliseconds here), not a speed target
def test_constraints_are_bounded(expr, message):
    from search_spaces import evaluate_constraint

    if message:
        with pytest.raises(ValueError, match=message):
            compile_constraint(expr, {"BLOCK": []})
    else:
        holds = compile_constraint(expr, {"BLOCK": []})
        assert [holds({"BLOCK": v}) for v in (0, 7, 1024)] == [False, False, False]
        with pytest.raises(ValueError):
            evaluate_constraint(expr, {"BLOCK": []}, {"BLOCK": 7 if "/" not in expr else 0})


def test_a_division_by_zero_rejects_only_the_points_where_it_happens():
    holds = compile_constraint("BLOCK / (BLOCK - 32) > 1", {"BLOCK": []})
    assert [holds({"BLOCK": b}) for b in (16, 32, 48)] == [False, False, True]
