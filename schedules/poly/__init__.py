"""The polyhedral layer: each kernel's loop nest as isl sets and maps (extraction), its dependences and
what they make legal (parallel loops, permutable bands, reductions, vector loops, fusion depths), data
footprints of tiles against the machine's caches, and the search hooks that use them (``cpu-poly``)."""
