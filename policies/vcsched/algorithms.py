"""Name -> solver for every VCSCHED algorithm, used by the policies, the CLI and the evaluation.

``solve(inst, name, ...)`` runs one algorithm (its placement, then the average-yield pass) and
returns a :class:`Solution`. Names: ``milp`` (exact, HiGHS), ``rrnd``, ``rrnz``, ``gr``, ``sg``,
``gb``, ``sgb``, ``mcb1`` .. ``mcb8``. The LP bound is not an algorithm (it places nothing): see
``milp.lp_bound``.
"""

from __future__ import annotations

from vmctl.errors import PolicyParameterError
from vmctl.policies.vcsched.greedy import DEFAULT_MAX_ATTEMPTS, backtracking, greedy
from vmctl.policies.vcsched.instance import Instance, Solution
from vmctl.policies.vcsched.mcb import DEFAULT_TOL, mcb
from vmctl.policies.vcsched.milp import solve_milp
from vmctl.policies.vcsched.rounding import DEFAULT_EPSILON, randomized_rounding

ALGORITHMS: tuple[str, ...] = ("milp", "rrnd", "rrnz", "gr", "sg", "gb", "sgb", *(f"mcb{k}" for k in range(1, 9)))
#: algorithms whose result depends on the seed
RANDOMIZED = frozenset({"rrnd", "rrnz"})


def solve(
    inst: Instance,
    name: str,
    seed: int = 0,
    time_limit: float | None = 60.0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    epsilon: float = DEFAULT_EPSILON,
    tol: float = DEFAULT_TOL,
) -> Solution:
    name = name.lower()
    if name == "milp":
        return solve_milp(inst, time_limit=time_limit)
    if name == "rrnd":
        return randomized_rounding(inst, seed=seed, epsilon=0.0, name="rrnd")
    if name == "rrnz":
        return randomized_rounding(inst, seed=seed, epsilon=epsilon, name="rrnz")
    if name == "gr":
        return greedy(inst, sort_by_memory=False, name="gr")
    if name == "sg":
        return greedy(inst, sort_by_memory=True, name="sg")
    if name == "gb":
        return backtracking(inst, sort_by_memory=False, max_attempts=max_attempts, name="gb")
    if name == "sgb":
        return backtracking(inst, sort_by_memory=True, max_attempts=max_attempts, name="sgb")
    if name.startswith("mcb") and name[3:].isdigit() and 1 <= int(name[3:]) <= 8:
        return mcb(inst, int(name[3:]), tol=tol)
    raise PolicyParameterError(
        policy="vcsched", param="algorithm", problem=f"unknown {name!r} (known: {', '.join(ALGORITHMS)})"
    )
