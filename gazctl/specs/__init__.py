"""Hierarchical YAML spec trees: strict decoding, flattening and hoisting."""
