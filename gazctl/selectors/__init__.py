"""Parsing and printing of label selector strings."""

from gazctl.selectors.parse import SelectorError, format_selector, parse_selector

__all__ = ["SelectorError", "format_selector", "parse_selector"]
