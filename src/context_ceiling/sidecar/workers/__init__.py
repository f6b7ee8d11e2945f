"""Several worker processes behind one port: the supervisor, and each worker's view of its siblings (shared pushes, pod metrics)."""
