"""vLLM: its rule, run from each release's own functions, and the engine itself from ``.venv-vllm``.

Rule: ``own`` runs a release's own functions on the draft's config (which ids, whether aux states at all,
the default), ``rule`` says what a run means and keeps the recorded rule for where no code can be read,
``source`` re-reads a release's capture facts to check them, ``faults`` names its known failures.

Live: ``install``, ``engine`` and its ``worker``, ``bench``, ``capture``, ``wirings``, and the ``plugin`` and
``connector`` that run inside it (docs/vllm.md). ``exports``: its /metrics families and log lines.
"""
