"""The demo pairs' factory, apart from the investigation: the embedded pairs built from nothing
(``embedded_pair``: ``build-default``), their corpus and tokenizer (``corpus``), fix B's retraining
(``draft_training``), and a trainer-style hidden-state dump written from a target (``dump_writer``:
``dump``). Nothing that diagnoses imports it."""
