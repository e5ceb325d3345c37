"""Load-time graph rewrites: between `ir` and `executor`, run once before a plan exists.

`optimize.optimize(graph, level)` is the driver: it copies the loaded graph, runs the
rules its level asks for, in order, and returns the rewritten graph with a `Rewrite`
row for each change, so the plan can show what runs differently from the model file
and why. Nothing here runs during a step.
"""
