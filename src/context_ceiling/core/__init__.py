"""context-ceiling core: definitions shared by the sidecar and the sweep."""
