"""Tasks: what a model is trained on and evaluated against (MNIST digits, parity vectors).

Each task will become a registry piece, like the step functions and the halting methods: one
module that draws or loads its data, says how many classes and inputs it has, and how its
evaluation is bucketed.
"""
