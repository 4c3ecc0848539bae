"""llama.cpp's side, on the plan of ``rules.sglang``: ``rule`` holds what each build read does with a
draft's ids (recorded per build), ``source`` reads a build's vendored sources to check it."""
