"""castcore's one contact with transformers: every use of its internals, in one package to adapt.

castcore builds causal LMs on the meta device (``causal_lm``), puts them on its own attention path
(``attention``, ``configs``), pre-fills a static KV cache for a decode step (``cache``), and recognises and swaps
parts of transformers' modules (``rotary``, ``layers``). Each function that relies on what transformers does not
promise says what, and the releases it was checked on ("checked 5.5.0-5.24.0"); ``versions.TESTED`` is the
tested range (``nox -s tests`` runs the newest, ``nox -s oldest`` the lowest bound pyproject admits). When a
release moves something, this package is what to change: the rest of castcore imports no transformers module
(tests/hf/test_hf.py checks). transformers is imported inside the functions, so a model that is not a transformers
model never pays for it. Callers import from the module that adapts what they need; this file exports nothing.
"""
