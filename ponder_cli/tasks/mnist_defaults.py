"""MNIST's default evaluation angles, in degrees, without torch: the task evaluates on them and
the command line's help shows them, so they are written here once."""

EVAL_ANGLES = (0.0,)  # eval: the test images as they are
EXTRAPOLATION_ANGLES = (22.5, 45.0, 67.5, 90.0)  # extrapolate and compare: beyond training's ±22.5
