"""llama.cpp: its rule per build, and the engine itself, built here from the pinned release.

Rule: ``rule`` holds what each build does with a draft's ids (recorded per build), ``source`` reads a
build's vendored sources to check it, ``gguf`` reads a converted draft's ``eagle3.target_layers``.

Live: ``build`` (llama-server and its converter, once per machine), ``convert`` (its own
convert_hf_to_gguf.py), ``engine`` (llama-server), ``bench``, ``costs`` (a round in decode steps;
docs/llamacpp.md). ``exports``: its /metrics families, log lines and /completion timings.
"""
