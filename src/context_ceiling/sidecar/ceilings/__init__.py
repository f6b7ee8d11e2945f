"""The running ceilings: the store that loads, watches and swaps them, and the admin API that shows and replaces them."""
