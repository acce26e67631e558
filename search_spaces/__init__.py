"""Search spaces: named compiler-flag spaces and constraint expressions over target params."""

from search_spaces._constraints import ConstraintError, compile_constraint, compile_expression, evaluate_constraint
from search_spaces._space import FlagSpace, available_spaces, load_space

__all__ = ["ConstraintError", "FlagSpace", "available_spaces", "compile_constraint", "compile_expression",
           "evaluate_constraint", "load_space"]
