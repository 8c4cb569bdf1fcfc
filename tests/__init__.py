"""Shared by the tests."""

# The bound on every wait for a server the tests talk to (each HTTP client's timeout, each
# socket's): a hang bound, never a verdict, so a slow or loaded machine never fails a test that
# is only slow. tests/test_test_clients.py checks that every client names it.
HANG_S = 600.0
