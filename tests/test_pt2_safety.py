"""Transitional: the .pt2 tests moved to ``tests/compiler/test_pt2_safety.py``.

``tests/service/test_upload_limits.py`` still imports these helpers from here; once it imports
them from ``tests.pt2_factory``, delete this file. It holds no tests.
"""
from tests.pt2_factory import Genuine, TinyNet, understated_member

__all__ = ["Genuine", "TinyNet", "understated_member"]
