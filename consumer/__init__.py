"""Gazette's consumer framework, in Python.

Built so far: `consumer.message`, the pure-logic message layer: message UUIDs and clocks,
framings (JSON lines, protobuf fixed, CSV) with incremental unpackers, mapping helpers that
choose a message's journal, and the Sequencer that delivers read-committed, exactly-once
messages. Publishers, readers over live journals, shards, transactions and stores come later.
"""
