"""Runnable examples, executed by the test suite (tests/test_examples.py, tests/contrib/)."""
