"""The sweep harness."""
