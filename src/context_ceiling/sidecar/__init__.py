"""The sidecar proxy."""
