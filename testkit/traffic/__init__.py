"""Generated traffic and canned documents: agent loops, RAG bodies, fuzzed bodies, a secret
corpus, ceilings documents."""
