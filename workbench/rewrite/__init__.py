"""Load-time graph rewrites: the layer between `ir` and `executor`.

Everything here runs once, at load, on a copy of the loaded `Graph`, before a plan
exists; nothing here runs during a step (what must be decided per step, such as the
decode-plan memo's shape folding, is the executor's). `optimize.optimize(graph,
level)` is the driver: it runs the rules the level asks for, in order, and returns the
rewritten graph with a `Rewrite` row for each change, so the plan can show what runs
differently from the model file and why.

Each rule is one module, whose docstring says what it rewrites, when it applies and
the invariant it relies on (why no value changes, or changes only within float
rounding):

- graph cleanup: `constant_folding`, `identity_ops`, `dead_nodes`, `unread_outputs`,
  `unused_initializers`;
- fusion (`fusion` lists them in order): `matmul_siblings`, the elementwise patterns
  (`fusion_patterns`: `layer_norm`, `rms_norm`, `gelu`, `silu`, and the same inside
  bodies), `fusion_attention`;
- weights for one-token products: `nbits_dequantized`, `matvec_threads`,
  `matvec_layout` (its setting for wide weights: `wide_layout`), `branch_weights` (the
  weight rules inside If branches), `huge_pages`.

What they share: `graph_edit` (the `Rewrite` record and a small graph editor),
`chain_match` (matching op-by-op chains), `weight_sharing` (one rewritten weight for
both branches of an If) and `kernel_info` (a node as its kernel sees it: folding runs
the kernel a run would use).

It may import `ir`, `ops` (kernels, to fold with them) and the leaf modules; never
`executor` or anything above it (`tests/architecture/test_layering.py`).
"""
