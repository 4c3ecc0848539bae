"""SGLang: its rule, read from each release's own files, and the engine itself from ``.venv-sglang``.

Rule (nothing imports sglang): ``source`` fetches and caches a release, ``classes`` walks its model classes,
``inspect`` reads a forward loop's capture (``sites`` holds what it finds), ``stub`` runs the release's
``set_eagle3_layers_to_capture``, ``resolve`` turns a draft's ids into the layout that release serves,
``patch`` is the boundary-0 patch, and ``rule`` holds what surrounds that step (which key it reads, the
documented 0.5.9 layout, draft-side mismatches no SGLang error reveals).

Live: ``install``, ``engine`` and its HTTP ``server``, ``bench`` (its live rows), ``capture``, ``plugin`` and
``hooks`` (the guard inside SGLang's processes), ``site`` (the guard for releases without plugins) and
``cpu`` (the accommodations it runs with on a host without a GPU, docs/sglang-cpu.md). ``exports``: what
its logs and responses say about acceptance.
"""
