"""The in-memory API (`fake_api`) for every webhook unit test."""

from wh_fakeapi import fake_api

__all__ = ["fake_api"]
