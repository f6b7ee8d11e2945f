"""Loopback stand-ins for what cannot run here (hosted providers, a Kubernetes API server, a model
with a known knee), each speaking the real wire format and named as a double."""
