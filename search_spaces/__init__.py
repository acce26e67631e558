"""Search spaces: named compiler-flag spaces and constraint expressions over target params."""

from search_spaces._constraints import compile_constraint, compile_expression
from search_spaces._space import FlagSpace, available_spaces, load_space

__all__ = ["FlagSpace", "available_spaces", "compile_constraint", "compile_expression", "load_space"]
