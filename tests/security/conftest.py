"""Fixtures of the security tests."""

from tests.security.other_user import shared_tmp

__all__ = ["shared_tmp"]
