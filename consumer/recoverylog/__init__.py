"""Gazette's recovery log: a shard's local files recorded as an op stream in a journal, and played back.

(The full API summary is filled in as the modules land.)
"""
