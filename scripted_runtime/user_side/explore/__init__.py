"""The explorer's search half (user process): Hypothesis strategies over
actions, the runner that sends each program to a live server, statistics,
parallel workers and the writer of failing programs. The program helpers and
the interpreter run in the scheduler: ``scripted_runtime.scheduler_side.explore``."""
