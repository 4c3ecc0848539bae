"""vLLM's side, on the plan of ``rules.sglang``: ``own`` runs a release's own functions on the draft's config
(which ids, whether aux states at all, the default), ``rule`` says what a run means and keeps the recorded
rule for where no code can be read, ``source`` re-reads a release's capture facts to check them."""
