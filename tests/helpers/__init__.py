"""Helpers shared by the tests: reference cases, the ORT peer, converter harnesses, subprocess workers."""
