"""The explorer's scheduler half: the interpreter that runs a program's
source, the helpers programs call, and the phase classification of control
operations. The search itself is in ``scripted_runtime.user_side.explore``."""
