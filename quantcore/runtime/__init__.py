"""The call path: from a public op's call to its kernel launch.

- `plans`: kept plans and their key (one definition, generated per op), the selection state it reads.
- `entry`: each op's public function and plan key, generated from its definition; traced (torch.compile),
  the function is its custom op.
- `dispatch`: a call without a kept plan: validate (the definition's spec), select (the registry),
  prepare the launch and keep the plan; `Site`, a caller's own kept plan.
- `launch`: the building blocks of the backends' prepared launches.
- `workspace`: what launches keep on a device (split-K partials and counters, the output templates'
  anchor), allocated outside any CUDA graph's pool: nothing quantcore keeps may outlive a graph in its pool.
- `native`: kept plans replayed in C++ (a torch extension, built in the background from the first CUDA use).

The runtime imports the definitions and the registry, never a backend: it launches the function the
registry resolves by name.
"""
