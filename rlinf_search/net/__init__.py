"""Calling remote services: HTTP helpers, failure kinds, retries under a deadline."""
