"""Example networks (``examples.networks.EXAMPLES``) and their ONNX / .pt2 export
(``examples.export``).

Nothing binary is committed: tests and benchmarks build and export the networks at run time,
e.g. ``python -m examples.export OUT_DIR [--names ...] [--formats onnx pt2]``.
"""
