"""skyrl-rlm-repl: a Recursive Language Model environment for SkyRL.

The model works in a sandboxed, persistent Python REPL (env ``rlm_repl``), can call sub-models and
child RLMs from its code, and is rolled out as a tree by the ``rlm_tree`` generator.
"""
