"""VCSCHED: resource allocation with virtual clusters (Casanova, Schanzenbach, Stillwell, Vivien,
INRIA RR-6692, 2008). Fractional CPU caps plus memory, maximizing the minimum yield.

Modules: ``instance`` (problems and solutions), ``milp`` (exact MILP, relaxation, bound),
``rounding`` (RRND, RRNZ), ``greedy`` (GR, SG, GB, SGB), ``mcb`` (MCB1-8), ``avgyield`` (the
average-yield pass), ``parallel`` (sec. 5), ``dynamic`` (sec. 6), ``generator`` (sec. 4.1 instances),
``algorithms`` (name -> solver), ``policy`` (the registered ``vcsched-*`` policies).
"""
