"""Small spaces for tests."""

FAKE_SPACE = """
name: fake
target: fake_targets:FakeTarget
settings: {sleep_s: 0.0}
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  mode:
    type: categorical
    values: [ok, crash, hang, oom, raise]
    default: ok
  x:
    type: categorical
    values: [0, 1, 2, 3, 4, 5, 6, 7]
    default: 0
"""
