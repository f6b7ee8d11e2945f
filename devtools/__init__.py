"""Demo, test and benchmark infrastructure: the local llama.cpp model and the generators of the
bundled task sets. Never installed: nothing the product runs imports it."""
