"""Ceilings: the versioned document (what a ceiling is per model and workload, and the
rule that only a newer version replaces a running one), and ``ceiling push``: one
compare-and-write flow behind one ``Target`` (a running sidecar, a file, a ConfigMap through
the Kubernetes API). The running side, the store that loads, watches and swaps a document
and the admin API, is the sidecar's (``context_ceiling.sidecar.ceilings``)."""
